"""The example plugin package (examples/autofl-example-plugin), installed from outside autofl's
source: its method (LG-FedAvg), model (mlp2h) and dataset (FedProx's Synthetic(1,1)) run in a
short `autofl search` whose trials train on Ray workers (heavy: starts Ray)."""

import json
import subprocess
import sys

import optuna
import pytest
import yaml

from conftest import require_example_plugin

pytestmark = pytest.mark.slow


def test_search_runs_the_plugins_method_model_and_dataset_on_ray_workers(tmp_path):
    require_example_plugin()
    space = {
        "study": "plugin",
        "base": {"data": {"dataset": "synthetic_1_1", "partition": {"kind": "natural"}},
                 "model": {"arch": "mlp2h", "hidden": 16}, "method": {"name": "lg_fedavg"},
                 "fl": {"rounds": 2, "participation": 0.2, "lr": 0.05}},
        "params": {"model.hidden": {"type": "int", "low": 8, "high": 32},
                   "fl.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}},
        "trials": 2,
        "scheduler": {"kind": "none"},
        "resources": {"cpu": 1},
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "autofl.cli", "search", "--space", str(path), "--dir", str(home)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = optuna.load_study(study_name="plugin", storage=f"sqlite:///{home / 'plugin' / 'optuna.db'}").get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert all(8 <= t.params["model.hidden"] <= 32 for t in trials)
    results = sorted((home / "plugin" / "tune").glob("run-*/FLTrainable_*/result.json"))
    assert len(results) == 2
    for result in results:  # each trial trained in a Ray worker process and reported both rounds
        rows = [json.loads(line) for line in result.read_text().splitlines()]
        assert [r["round"] for r in rows] == [1, 2]
        assert all(r["node_id"] != "local" and 0 <= r["personal_val_acc"] <= 1 for r in rows)
        assert "global_val_acc" not in rows[-1] or rows[-1]["global_val_acc"] is None  # LG-FedAvg: no global model

"""A trial whose worker process is SIGKILLed mid-run restarts from its last checkpoint
(FailureConfig(max_failures)) and its rounds continue exactly: its final metrics equal an
uninterrupted `autofl train` of the same config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import optuna
import pytest
import yaml

from conftest import processes, with_descendants
from test_search_e2e import AUTOFL, run

pytestmark = pytest.mark.slow


def _worker_pids(driver_pid: int) -> list[int]:
    """This driver's trial workers (its descendants titled ray::<...>Trainable, e.g.
    ray::ResourceTrainable.train while training), never another Ray's."""
    table = processes()
    found = []
    for pid in with_descendants({driver_pid}, table) - {driver_pid}:
        cmdline = table[pid][1].replace(b"\0", b" ").decode(errors="replace")
        if cmdline.startswith("ray::") and "Trainable" in cmdline:
            found.append(pid)
    return found


@pytest.mark.parametrize("population", [1, 3])
def test_killed_worker_resumes_from_its_checkpoint_round_for_round(tmp_path, population):
    """With population 3 (issue 37), one worker trains a cohort of 3 configs: each resumes from the
    cohort's checkpoint and ends as its uninterrupted run."""
    home = tmp_path / "home"
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "study": "wk",
        "base": {"data": {"num_clients": 4, "partition": {"kind": "pathological", "classes_per_client": 3}},
                 "fl": {"rounds": 40, "local_epochs": 4}, "method": {"name": "fedavg"}},
        "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}},
        "trials": population, "scheduler": {"kind": "none"}, "resources": {"cpu": 1, "population": population},
        "checkpoint_every_s": 0,
    }))
    driver = subprocess.Popen([*AUTOFL, "search", "--space", str(space), "--dir", str(home)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"sqlite:///{home / 'wk' / 'optuna.db'}"
    killed = False
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None and not killed:
        time.sleep(0.2)
        try:
            trials = optuna.load_study(study_name="wk", storage=url).trials
        except Exception:  # not created yet
            continue
        workers = _worker_pids(driver.pid)
        if trials and len(trials[0].intermediate_values) >= 5 and workers:
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            killed = True
    assert killed, "the trial ended before its worker could be killed; make it longer"
    assert driver.wait(timeout=600) == 0
    trials = optuna.load_study(study_name="wk", storage=url).trials
    assert len(trials) == population and len({t.user_attrs["tune_trial_id"].split(":")[0] for t in trials}) == 1
    for trial in trials:
        assert trial.state.name == "COMPLETE" and sorted(trial.intermediate_values) == list(range(1, 41))
        # the same config, uninterrupted
        config = yaml.safe_load(space.read_text())["base"]
        config["fl"]["lr"] = trial.params["fl.lr"]
        config["runtime"] = {"threads": 1, "device": "cpu"}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        out = tmp_path / f"t{trial.number}"
        proc = run(["train", "--config", tmp_path / "c.yaml", "--out", out])
        assert proc.returncode == 0, proc.stderr[-2000:]
        clean = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert {r["round"]: r["personal_val_acc_last3"] for r in clean} == trial.intermediate_values  # the objective
        assert clean[-1]["train_loss"] == trial.user_attrs["train_loss"]

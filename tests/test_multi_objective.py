"""Multi-objective studies: `objectives: [...]` runs the space's Optuna sampler over several objectives (no ASHA), and
status, report and `best-config export --pareto` show the Pareto front."""

from __future__ import annotations

import os
import re
import time

import pytest
import yaml

from autofl.errors import ConfigError
from autofl.tuning.strategy.space import SearchSpace, load_space
from autofl.tuning.store.study import SETTLED_S, TRIALS_SNAPSHOT
from test_search_e2e import run, space_file, trials_of
from test_startup_imports import loaded


def _write(tmp_path, **changes):
    space = {"study": "mo", "base": {"fl": {"rounds": 3}}, "params": {"fl.lr": {"type": "float", "low": 0.01,
                                                                               "high": 0.1}},
             "scheduler": {"kind": "none"}, **changes}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_objectives_take_validation_metrics_with_a_mode_each(tmp_path):
    space = load_space(_write(tmp_path, objectives=["personal_val_acc", "personal_val_acc_std"]))
    assert space.multi_objective and space.metrics == ["personal_val_acc", "personal_val_acc_std"]
    assert space.modes == ["max", "min"] and (space.objective, space.mode) == ("personal_val_acc", "max")
    assert not SearchSpace.model_validate({"study": "x"}).multi_objective


@pytest.mark.parametrize("changes,needle", [
    ({"objectives": ["personal_val_acc", "personal_val_acc_p10"], "scheduler": {"kind": "asha"}},
     "scheduler.kind: 'asha' ranks trials by one metric; a multi-objective study needs scheduler: {kind: none}"),
    ({"objectives": ["personal_val_acc"]}, "must name 2 or more different validation metrics"),
    ({"objectives": ["personal_val_acc", "personal_val_acc"]}, "must name 2 or more different validation metrics"),
    ({"objectives": ["personal_val_acc", "personal_test_acc"]},
     "objectives[1]: 'personal_test_acc' is not a validation metric"),
    ({"objectives": ["personal_val_acc", "personal_val_acc_p10"], "modes": ["max"]},
     "modes: 1 given for 2 objectives"),
    ({"objectives": ["personal_val_acc", "global_val_acc"], "base": {"method": {"name": "fedfcd"}}},
     "method fedfcd has no global model, so global_val_acc is undefined"),
])
def test_objective_errors_are_one_line_before_ray(tmp_path, changes, needle):
    with pytest.raises(ConfigError) as info:
        load_space(_write(tmp_path, **changes))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_multi_objective_study_has_a_pareto_front(tmp_path):
    home = tmp_path / "home"
    path = space_file(tmp_path, "mo", trials=5, rounds=3)
    space = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**space, "scheduler": {"kind": "none"},
                                    "objectives": ["personal_val_acc", "personal_val_acc_p10"]}))
    cache = tmp_path / "cache"
    proc = run(["search", "--space", path, "--dir", home], env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the driver leaves what the read-only commands would read slowly (issue 42): the trial rows, so
    # the first status after the search imports no Optuna, and autofl list's rows
    assert (home / "mo" / TRIALS_SNAPSHOT).is_file() and list((cache / "autofl").glob("listing-*.json"))
    time.sleep(SETTLED_S)  # rows are taken only from a storage still for that long
    code, modules = loaded("status", "mo", "--dir", home)
    assert (code, modules) == (0, set())
    kept_front = run(["status", "mo", "--dir", home]).stdout  # the Pareto line, from the kept rows
    trials = trials_of(home, "mo")
    assert len(trials) == 5 and all(t.state.name == "COMPLETE" and len(t.values) == 2 for t in trials)

    out = tmp_path / "front.yaml"
    proc = run(["best-config", "export", "mo", "--pareto", "-o", out, "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    front = yaml.safe_load(out.read_text())
    assert front["objectives"] == {"personal_val_acc": "max", "personal_val_acc_p10": "max"}
    on_front = {e["trial"]: tuple(e["values"].values()) for e in front["pareto_front"]}
    dominated = lambda a, b: b[0] >= a[0] and b[1] >= a[1] and b != a  # noqa: E731  (b dominates a)
    values = {t.number: tuple(t.values) for t in trials}
    for number, v in values.items():  # the front is exactly the non-dominated trials
        assert (number in on_front) == (not any(dominated(v, w) for w in values.values())), (number, values)
    for entry in front["pareto_front"]:
        assert entry["config"]["metadata"]["trial"] == entry["trial"]

    status = run(["status", "mo", "--dir", home])
    assert "Pareto front of personal_val_acc (max), personal_val_acc_p10 (max): trial" in status.stdout
    assert status.stdout == kept_front
    line = next(x for x in status.stdout.splitlines() if x.startswith("Pareto front"))
    assert sorted(int(n) for n in re.findall(r"trial (\d+)", line)) == sorted(on_front)
    report = run(["report", "mo", "--dir", home])
    assert report.returncode == 0 and (home / "mo" / "report" / "pareto_front.png").is_file()
    assert "<h2>Pareto front</h2>" in (home / "mo" / "report" / "report.html").read_text()

    single = run(["best-config", "export", "mo", "--pareto", "--reeval", "2", "--dir", home])
    assert single.returncode == 2 and "--reeval ranks configs on one objective" in single.stderr
    reeval = run(["reeval", "mo", "--dir", home])
    assert reeval.returncode == 2 and "is multi-objective" in reeval.stderr

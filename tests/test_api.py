"""The Python API (autofl.train, autofl.search, Study): the same runs as the CLI, errors raised
as exceptions instead of exit codes, and a cheap `import autofl`."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import autofl
from autofl.errors import AutoFLError, ConfigError
from conftest import read_metrics

TINY = {"data": {"num_clients": 4, "partition": {"kind": "pathological", "classes_per_client": 3}},
        "fl": {"rounds": 3, "participation": 0.5}, "method": {"name": "fedprox", "mu": 0.1}}


def test_import_autofl_loads_neither_torch_nor_ray_nor_optuna():
    code = ("import sys, autofl; heavy = [m for m in ('torch', 'ray', 'optuna') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_public_names_are_exported_from_autofl():
    from autofl.engine.plan import ClientStart, Stage, Update
    from autofl.methods.base import Method, MethodParams
    from autofl.models.parts import SplitModel

    assert (autofl.Method, autofl.MethodParams, autofl.Stage, autofl.Update, autofl.ClientStart,
            autofl.SplitModel) == (Method, MethodParams, Stage, Update, ClientStart, SplitModel)
    assert set(autofl.__all__) <= set(dir(autofl))
    for name in autofl.__all__:
        assert getattr(autofl, name) is not None
    with pytest.raises(AttributeError):
        autofl.no_such_name  # noqa: B018


def test_no_public_name_is_also_a_module_of_autofl():
    """Importing a submodule binds it on its package, replacing an exported function of the same
    name (autofl.train would become a module): the study side is autofl.tuning, so autofl.search
    stays the function."""
    import pkgutil

    modules = {info.name for info in pkgutil.iter_modules(autofl.__path__)}
    clashes = sorted(set(autofl.__all__) & modules)
    assert clashes == []


def test_autofl_search_stays_the_function_after_the_tuning_package_loads():
    """Importing autofl.tuning.* binds autofl.tuning, never autofl.search."""
    import inspect

    import autofl.tuning.store.study  # noqa: F401

    assert callable(autofl.search)
    assert list(inspect.signature(autofl.search).parameters)[:6] == \
        ["space", "name", "trials", "dir", "address", "resume"]
    with pytest.raises(AutoFLError, match="give --space FILE"):
        autofl.search()


def test_train_on_a_dict_gives_the_cli_round_metrics(run_cli, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert run_cli("train", "--config", config, "--out", tmp_path / "cli") == 0
    cli_rounds = read_metrics(tmp_path / "cli")

    result = autofl.train(TINY, out=tmp_path / "api")
    assert isinstance(result, autofl.RunResult)
    assert result.rounds == cli_rounds == read_metrics(tmp_path / "api")
    assert [m["round"] for m in result.rounds] == [1, 2, 3]
    assert result.final == cli_rounds[-1]
    assert result.out == tmp_path / "api" and (result.out / "final_state.pt").is_file()
    assert result.experiment.method.name == "fedprox" and result.experiment.method.params()["mu"] == 0.1
    # the same experiment from its pydantic object and from a YAML path, with an override
    again = autofl.train(result.experiment, out=tmp_path / "api2")
    assert again.rounds == cli_rounds
    shorter = autofl.train(config, out=tmp_path / "api3", overrides=["fl.rounds=2"])
    assert shorter.rounds == cli_rounds[:2]


def test_bad_input_raises_one_line_errors_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=r"fl\.rounds"):
        autofl.train({"fl": {"rounds": 0}}, out=tmp_path / "run")
    with pytest.raises(ConfigError, match="method.name: unknown method 'nope'"):
        autofl.train({"method": {"name": "nope"}}, out=tmp_path / "run")
    with pytest.raises(ConfigError, match="allowed: a dict, an Experiment"):
        autofl.train(42, out=tmp_path / "run")
    with pytest.raises(AutoFLError, match="folder already holds files"):
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "keep.txt").write_text("mine")
        autofl.train(TINY, out=tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "run").exists()

    home = tmp_path / "home"
    with pytest.raises(ConfigError, match=r"space: params.fl.lr.type"):
        autofl.search({"study": "bad", "params": {"fl.lr": {"type": "real"}}}, dir=home)
    with pytest.raises(ConfigError, match="no such file"):
        autofl.search(tmp_path / "missing.yaml", dir=home)
    with pytest.raises(AutoFLError, match="study 'bad' not found"):
        autofl.load_study("bad", dir=home)
    with pytest.raises(AutoFLError, match="study 'bad' not found"):
        autofl.search(name="bad", resume=True, dir=home)
    assert not (home / "bad").exists()


@pytest.fixture
def ray_in_this_process():
    """autofl.search starts Ray in the calling process and routes its logs: undo both afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    import ray

    ray.shutdown()
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    logging.captureWarnings(False)


@pytest.mark.slow
def test_search_from_python_returns_a_study_whose_best_config_trains(tmp_path, ray_in_this_process):
    home = tmp_path / "home"
    space = {"study": "api", "base": {**TINY, "method": {"name": "fedavg"}},
             "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}},
             "trials": 3, "scheduler": {"kind": "none"}, "resources": {"cpu": 1}}
    started = []
    study = autofl.search(space, dir=home, on_start=lambda s, logs: started.append((s.name, logs)))
    assert isinstance(study, autofl.Study) and study.name == "api" and study.root == home / "api"
    assert started == [("api", home / "api" / "logs")]
    assert yaml.safe_load((study.root / "space.yaml").read_text()) == space  # the study keeps its space

    frame = study.trials_dataframe()
    assert sorted(frame["number"]) == [0, 1, 2]
    assert {"value", "params_fl.lr", "state", "autofl_state", "round", "objective"} <= set(frame.columns)
    assert list(frame["autofl_state"]) == ["COMPLETE"] * 3 and list(frame["round"]) == [3, 3, 3]
    assert list(frame["objective"]) == list(frame["value"])
    assert study.counts() == {"COMPLETE": 3}

    best = study.best_trial()
    assert best.value == max(frame["value"])
    reopened = autofl.load_study("api", dir=home)
    config = reopened.best_config()
    assert config["metadata"]["trial"] == best.number and config["fl"]["lr"] == best.params["fl.lr"]
    rerun = autofl.train(config, out=tmp_path / "rerun")  # reproduces the trial's rounds exactly
    # a trial's values are its objective's, by default the 3-round mean of personal_val_acc
    assert [m["personal_val_acc_last3"] for m in rerun.rounds] == [best.intermediate_values[r] for r in (1, 2, 3)]

    summary = reopened.reevaluate(seeds=2, top=1)
    assert [r["candidate"] for r in summary["rows"]][0] == "default" and len(summary["rows"]) == 2
    assert summary["seeds"] == [1000, 1001] and summary["verdict"]
    assert json.loads(json.dumps(summary)) == reopened.reeval_summary()
    assert reopened.best_config()["metadata"]["reeval"]["verdict"] == summary["verdict"]

    page = reopened.report(tmp_path / "report")
    assert page == tmp_path / "report" / "report.html"
    assert "api" in page.read_text() and list((tmp_path / "report").glob("*.png"))
    assert autofl.list_studies(home) == ["api"]


@pytest.mark.slow
def test_a_ctrl_c_after_tune_returned_says_how_to_resume_and_resume_finishes_the_run(tmp_path, ray_in_this_process,
                                                                                       monkeypatch, ctrl_c_raises):
    """Tune turns the first Ctrl-C during its loop into a graceful stop; one that arrives after Tune
    returned (the run is being settled) is a KeyboardInterrupt. CI saw `autofl search` end with a
    bare "autofl: interrupted" there: it is StudyInterrupted with the resume line, as any Ctrl-C."""
    import os
    import signal

    from autofl.tuning.tune import runner
    from autofl.tuning.tune.experiment import StudyInterrupted

    home = tmp_path / "home"
    space = {"study": "late", "base": {**TINY, "method": {"name": "fedavg"}},
             "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}},
             "trials": 2, "scheduler": {"kind": "none"}, "resources": {"cpu": 1}}
    calls, flag_writes = [], []
    write_flag = runner.mark_finished

    def ctrl_c_then_write_flag(study):
        calls.append(study.name)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: before the flag is written
        flag_writes.append(study.name)
        write_flag(study)

    monkeypatch.setattr(runner, "mark_finished", ctrl_c_then_write_flag)
    with pytest.raises(StudyInterrupted, match="resume it with autofl search --resume 'late'"):
        autofl.search(space, dir=home)
    assert flag_writes == [] and not list((home / "late").glob("tune/run-1/.autofl_finished"))
    assert autofl.load_study("late", dir=home).counts() == {"COMPLETE": 2}  # Tune's run had ended

    study = autofl.search(name="late", resume=True, dir=home)
    assert flag_writes == ["late"] and list((home / "late").glob("tune/run-1/.autofl_finished"))
    assert study.counts() == {"COMPLETE": 2} and len(study.trials()) == 2  # nothing run twice


@pytest.mark.slow
def test_a_ctrl_c_during_reevaluation_stops_it_keeps_the_finished_runs_and_a_rerun_finishes(tmp_path,
                                                                                        ray_in_this_process,
                                                                                        ctrl_c_raises):
    """Tune ends its loop gracefully on Ctrl-C and returns as if done: re-evaluation used to go on
    and save a verdict from the runs that happened to finish. It stops instead (exit 130 from the
    CLI) with the finished runs on disk; the same call again runs only what is missing."""
    import os
    import signal

    from autofl.tuning.reeval import ReevalInterrupted, load_finished, load_summary
    from autofl.tuning.store.study import open_study

    home = tmp_path / "home"
    space = {"study": "stop", "base": {**TINY, "method": {"name": "fedavg"}},
             "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}},
             "trials": 2, "scheduler": {"kind": "none"}, "resources": {"cpu": 1}}
    study = autofl.search(space, dir=home)
    done = []

    def ctrl_c_after_the_first(run, metrics):
        done.append(run.key)
        if len(done) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(ReevalInterrupted, match="run the same command again to finish") as stopped:
        study.reevaluate(seeds=3, top=1, on_done=ctrl_c_after_the_first)
    assert stopped.value.exit_code == 130
    folder = open_study(home, "stop")
    kept = set(load_finished(folder))
    assert set(done) == kept and 1 <= len(kept) < 6 and load_summary(folder) is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Tune's handler did not stay

    summary = study.reevaluate(seeds=3, top=1, on_done=lambda run, metrics: done.append(run.key))
    assert sorted(done) == sorted(set(done)) and len(done) == 6  # each run once across the two calls
    assert len(summary["rows"]) == 2 and load_summary(folder) == summary

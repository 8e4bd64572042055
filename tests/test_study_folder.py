"""A study is bound to its folder (issue 42): a copy (`cp -a`) of an interrupted study resumes into
its own optuna.db and Tune runs, never the original's, and a store that lies in another study's
folder is one line of error (exit 2) that writes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autofl.tuning.store.storage import open_storage

from test_search_e2e import AUTOFL, run, space_file, study_record, trials_of


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_store_in_another_studys_folder_is_one_line_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    space = space_file(tmp_path, "orig", trials=2, rounds=2)
    for name in ("orig", "copy"):  # two study folders, made without running anything
        (home / name).mkdir(parents=True)
        (home / name / "space.yaml").write_text(space.read_text())
    (home / "orig" / "optuna.db").write_bytes(b"")
    (home / "copy" / "study.json").write_text(json.dumps({"runs": [{"name": "run-1", "trials": 2}],
                                                          "trials_requested": 2,
                                                          "storage": f"sqlite:///{home / 'orig' / 'optuna.db'}"}))
    before = _files(home / "orig")
    for args in (["search", "--resume", "copy"], ["status", "copy"]):
        proc = run([*args, "--dir", home])
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.count("\n") == 1 and str(home / "orig") in proc.stderr and "copy" in proc.stderr, proc.stderr
    assert _files(home / "orig") == before


@pytest.mark.slow
def test_a_copied_interrupted_study_resumes_into_its_own_folder(tmp_path):
    home = tmp_path / "home"
    space = space_file(tmp_path, "k2", trials=4, rounds=12)
    tree = yaml.safe_load(space.read_text())
    tree.update(resources={"cpu": 1, "max_concurrent": 1}, scheduler={"kind": "asha", "grace_period": 4,
                                                                        "reduction_factor": 2})
    space.write_text(yaml.safe_dump(tree))
    driver = subprocess.Popen([*AUTOFL, "search", "--space", str(space), "--dir", str(home)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None:
        time.sleep(0.3)
        try:
            if sum(t.state.is_finished() for t in trials_of(home, "k2")) >= 1:
                break
        except Exception:  # not created yet
            continue
    assert driver.poll() is None, "the study ended before Ctrl-C; make it longer"
    os.killpg(driver.pid, signal.SIGINT)
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 130, err[-2000:]
    original = study_record(trials_of(home, "k2"))
    original_files = _files(home / "k2" / "tune")
    assert (home / "k2" / "tune" / "run-1" / "tuner.pkl").is_file()

    subprocess.run(["cp", "-a", str(home / "k2"), str(home / "k2c")], check=True)
    proc = run(["search", "--resume", "k2c", "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the copy's own optuna.db holds the study under the name it was created with
    copy = optuna.load_study(study_name="k2", storage=open_storage(f"sqlite:///{home / 'k2c' / 'optuna.db'}")).trials
    assert len([t for t in copy if t.state.name in ("COMPLETE", "PRUNED")]) == 4, [t.state.name for t in copy]
    assert all(t.state.is_finished() for t in copy)
    # the original is untouched: its trials, its store, its Tune runs
    assert study_record(trials_of(home, "k2")) == original
    assert _files(home / "k2" / "tune") == original_files

    # an interrupted run recorded by an autofl of another module layout (Tune's tuner.pkl names
    # modules by path) is not restored: its missing trials run as a new experiment
    from autofl.tuning.store.study import StudyFolder
    from autofl.tuning.tune.runner import interrupted_run

    assert interrupted_run(StudyFolder(home / "k2")) == str(home / "k2" / "tune" / "run-1")
    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.store.study import RECORD_ATTR

    ledger = Ledger(home / "k2")
    record = ledger.record()
    record["runs"] = [{k: v for k, v in r.items() if k != "layout"} for r in record["runs"]]
    ledger.study().set_user_attr(RECORD_ATTR, record)
    assert interrupted_run(StudyFolder(home / "k2")) is None
    proc = run(["search", "--resume", "k2", "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = trials_of(home, "k2")
    assert len([t for t in resumed if t.state.name in ("COMPLETE", "PRUNED")]) == 4 and all(
        t.state.is_finished() for t in resumed)


DRIVER_WITH_FULL_DISK = """
import errno, sys
from autofl.tuning.store.ledger import Ledger
closes = []
close = Ledger.close
def full_disk_at_the_second_close(self, *args, **kwargs):
    closes.append(1)
    if len(closes) == 2:
        raise OSError(errno.ENOSPC, "No space left on device", self.root + "/optuna.db")
    return close(self, *args, **kwargs)
Ledger.close = full_disk_at_the_second_close
from autofl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_full_disk_mid_search_is_one_line_and_the_study_resumes_to_its_end(tmp_path):
    """Issue 42: a write that fails for lack of space mid-search (here the second trial's close)
    is one line, exit 2, leaves the study as it was before the write, and --resume then runs the
    remaining trials: never exit 130 'interrupted' without a signal, never 'has run all its trials'
    with trials missing."""
    import sys

    home = tmp_path / "home"
    space = space_file(tmp_path, "full", trials=4, rounds=2)
    tree = yaml.safe_load(space.read_text())
    tree.update(resources={"cpu": 1, "max_concurrent": 1}, scheduler={"kind": "none"})
    space.write_text(yaml.safe_dump(tree))
    proc = subprocess.run([sys.executable, "-c", DRIVER_WITH_FULL_DISK, "search", "--space", str(space),
                           "--dir", str(home)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and "No space left on device" in proc.stderr, proc.stderr[-3000:]
    trials = trials_of(home, "full")
    # the trial whose close failed is as it was before that write (open); Tune went on with the others
    assert trials[1].state.name == "RUNNING" and not trials[1].user_attrs.get("interrupted"), trials[1]
    assert {t.state.name for t in trials} <= {"COMPLETE", "RUNNING"}, [t.state.name for t in trials]

    proc = run(["search", "--resume", "full", "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = trials_of(home, "full")
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4, [(t.state.name, t.user_attrs) for t in trials]
    again = run(["search", "--resume", "full", "--dir", home])
    assert again.returncode == 0 and "has run all its trials" in again.stdout

"""Processes that open one new storage at once all get it: Optuna creates its tables and stamps its
schema version by check-then-write, and autofl's `open_storage` retries the loser of that race (a CI
run lost a driver to it: `autofl search` failed with "UNIQUE constraint failed: alembic_version" while
a reader opened its new optuna.db). The PostgreSQL case is in test_postgres.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

OPENER = """
import sys, time
from pathlib import Path
import optuna, sqlalchemy  # imported before 'ready', so that all the processes open at once
from autofl.tuning.store.storage import probe_storage
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
probe_storage(sys.argv[1])
"""


def open_at_once(url: str, processes: int, folder: Path) -> list[str]:
    """Start `processes` Pythons that each open `url` with `open_storage` at the same moment; the
    stderr of each one that failed."""
    go = folder / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, url, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.communicate()[1]
    go.touch()
    failed = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            failed.append(err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}")
    return failed


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_processes_opening_a_new_storage_at_once_all_open_it(tmp_path, kind):
    import optuna

    from autofl.tuning.store.storage import open_storage

    for attempt in range(4):  # each attempt a new file: the race is in creating it
        folder = tmp_path / f"db{attempt}"
        folder.mkdir()
        url = f"sqlite:///{folder / 'optuna.db'}" if kind == "sqlite" else f"journal://{folder / 'optuna.log'}"
        assert open_at_once(url, 6, folder) == []
        # one schema, stamped once (one journal file), that Optuna opens and writes to
        study = optuna.create_study(study_name="after", storage=open_storage(url))
        assert study.ask().number == 0


def test_an_error_that_is_not_the_creation_race_is_not_retried(tmp_path, monkeypatch):
    import autofl.tuning.store.storage as storage
    from autofl.errors import StorageError

    bad = tmp_path / "not-a-db.db"
    bad.write_bytes(b"this is not an SQLite file" * 100)
    opened = []
    real = storage._open_rdb
    monkeypatch.setattr(storage, "_open_rdb", lambda url: opened.append(url) or real(url))
    started = time.monotonic()
    with pytest.raises(StorageError, match="not a database"):
        storage.open_storage(f"sqlite:///{bad}")
    assert len(opened) == 1 and time.monotonic() - started < 5


ASKER = """
import sys, time
from pathlib import Path
import optuna
from autofl.tuning.store.ledger import Ledger
ledger = Ledger(sys.argv[1])
ledger.study()
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
asked = 0
while ledger.ask(f"join-{sys.argv[3]}", f"t{asked}", set(), 100, optuna.samplers.RandomSampler(),
                 lambda trial: trial.suggest_float("x", 0.0, 1.0)) is not None:
    asked += 1
print(asked, flush=True)
"""


def test_drivers_sharing_a_journal_never_create_more_trials_than_the_study_requested(tmp_path):
    """Several drivers on one journal count and create trials under one lock file (PostgreSQL: an
    advisory lock), so together they create exactly the study's requested total."""
    from conftest import new_ledger

    ledger = new_ledger(tmp_path, "journal")
    ledger.add_run("run-1", 12, 1, join=False)  # what a driver records: the total they count against
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", ASKER, ledger.root, str(go), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.communicate()[1]
    go.touch()
    asked = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        asked.append(int(out.split()[-1]))
    assert sum(asked) == 12 and len(ledger.trials()) == 12, asked

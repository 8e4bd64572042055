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
from autofl.tuning.storage import open_storage
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
open_storage(sys.argv[1]).engine.dispose()
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


def test_processes_opening_a_new_sqlite_storage_at_once_all_open_it(tmp_path):
    import optuna

    for attempt in range(4):  # each attempt a new file: the race is in creating it
        folder = tmp_path / f"db{attempt}"
        folder.mkdir()
        url = f"sqlite:///{folder / 'optuna.db'}"
        assert open_at_once(url, 6, folder) == []
        # one schema, stamped once, that Optuna opens and writes to
        study = optuna.create_study(study_name="after", storage=url)
        assert study.ask().number == 0


def test_an_error_that_is_not_the_creation_race_is_not_retried(tmp_path, monkeypatch):
    import autofl.tuning.storage as storage
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

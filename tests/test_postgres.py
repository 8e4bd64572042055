"""Studies on a real PostgreSQL server (Debian's package; `.ci/run` installs it when missing):
search, SIGKILL of the driver and resume, export, two drivers on one study (`--join`), and the
password never written or printed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import optuna
import pytest
import yaml

from autofl.tuning.store.storage import open_storage
from conftest import kill_driver_and_its_ray
from pg_server import PgServer, serve_pg
from test_storage_race import open_at_once
from test_search_e2e import space_file

pytestmark = pytest.mark.slow
AUTOFL = [sys.executable, "-m", "autofl.cli"]


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    yield from serve_pg()


def space(tmp_path: Path, study: str, trials: int, rounds: int, storage: str | None = None) -> Path:
    """The end-to-end tests' space, checkpointing every round, on `storage` when given."""
    path = space_file(tmp_path, study, trials, rounds)
    tree = {**yaml.safe_load(path.read_text()), "checkpoint_every_s": 0}
    if storage:
        tree["storage"] = storage
    path.write_text(yaml.safe_dump(tree))
    return path


_READERS: dict[str, object] = {}  # one storage per server for the test's own reads


def trials_of(pg: PgServer, name: str):
    # through autofl's open_storage: a read that starts while the driver creates the tables retries as it
    # does. Opened once per server: a storage per 1 s poll held a pooled connection each until the garbage
    # collector ran, and under CI's load a slow first trial let them reach max_connections (100), so the
    # drivers under test were refused ("too many clients already")
    if pg.url_with_password not in _READERS:
        _READERS[pg.url_with_password] = open_storage(pg.url_with_password)
    return optuna.load_study(study_name=name, storage=_READERS[pg.url_with_password]).get_trials()


def wait_for(predicate, seconds: float = 600) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError("timed out")


def finished_count(pg: PgServer, name: str) -> int:
    try:
        return sum(t.state.is_finished() for t in trials_of(pg, name))
    except KeyError:  # study not created yet
        return 0


def test_postgres_study_survives_a_killed_driver_and_never_writes_the_password(pg, tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "AUTOFL_STORAGE": pg.url_with_password}  # the password comes from the environment only
    env.pop("PGPASSWORD", None)
    outputs: list[str] = []

    def run(*args: object) -> subprocess.CompletedProcess:
        proc = subprocess.run([*AUTOFL, *map(str, args)], capture_output=True, text=True, timeout=900, env=env)
        outputs.extend([proc.stdout, proc.stderr])
        return proc

    log = tmp_path / "driver.log"
    with open(log, "w") as sink:
        # 160 rounds: the paper default (trial 0, never pruned) outlives the pruned trials by ~6 s, so the
        # study cannot end between the second finished trial and the kill (at 40, 1.7 s against a 1 s poll)
        driver = subprocess.Popen([*AUTOFL, "search", "--space", str(space(tmp_path, "pgkill", 6, 160)), "--dir",
                                   str(home)], stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_for(lambda: finished_count(pg, "pgkill") >= 2 or driver.poll() is not None)
        assert driver.poll() is None, "the study finished before it could be killed; make it longer"
        kill_driver_and_its_ray(driver)
    outputs.append(log.read_text())
    finished_before = {t.number: (t.state.name, t.value) for t in trials_of(pg, "pgkill") if t.state.is_finished()}
    assert len(finished_before) < 6, finished_before  # killed mid-study

    proc = run("search", "--resume", "pgkill", "--dir", home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = trials_of(pg, "pgkill")
    assert all(t.state.is_finished() for t in after), [t.state.name for t in after]
    for number, (state, value) in finished_before.items():
        assert (after[number].state.name, after[number].value) == (state, value)
    real = [t for t in after if not t.user_attrs.get("interrupted")]
    assert len(real) == 6, " ".join(f"{t.number}:{t.state.name}:{t.user_attrs.get('tune_run')}:"
                                    f"{'interrupted' if t.user_attrs.get('interrupted') else ''}" for t in after)
    ids = [t.user_attrs["tune_trial_id"] for t in real]
    assert len(set(ids)) == len(ids)
    assert all(t.user_attrs.get("node_id") for t in real if t.state.name != "FAIL")

    status = run("status", "pgkill", "--dir", home)
    assert status.returncode == 0 and "postgresql+psycopg://autofl@127.0.0.1" in status.stdout
    out = tmp_path / "best.yaml"
    assert run("best-config", "export", "pgkill", "--reeval", "0", "--dir", home, "-o", out).returncode == 0
    assert yaml.safe_load(out.read_text())["metadata"]["study"] == "pgkill"

    env["AUTOFL_STORAGE"] = pg.url_with_password.replace(str(pg.port), "1")  # nothing listens there
    refused = run("search", "--space", space(tmp_path, "pgdown", 2, 2), "--dir", home)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "storage: cannot open" in refused.stderr
    assert ":1/autofl" in refused.stderr and not (home / "pgdown").exists()  # nothing half-made

    secret = pg.password.encode()
    for text in outputs:
        assert pg.password not in text
    for path in [*home.rglob("*"), out]:
        if path.is_file():
            assert secret not in path.read_bytes(), path


def test_drivers_opening_a_new_postgres_database_at_once_all_open_it(pg, tmp_path, monkeypatch):
    """Several drivers on a new database create Optuna's tables at the same moment; the losers of that
    race retry instead of failing (see test_storage_race.py)."""
    import psycopg

    monkeypatch.setenv("PGPASSWORD", pg.password)
    for attempt in range(3):
        database = f"race{attempt}"
        with psycopg.connect(host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {database}")
        url = f"postgresql+psycopg://{pg.user}@{pg.host}:{pg.port}/{database}"
        folder = tmp_path / database
        folder.mkdir()
        assert open_at_once(url, 6, folder) == []
        assert optuna.create_study(study_name="after", storage=url).ask().number == 0


JOIN_ROUNDS = 120


def test_two_drivers_share_one_study_and_its_budget(pg, tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "PGPASSWORD": pg.password}  # libpq's own variable; the space holds no password
    env.pop("AUTOFL_STORAGE", None)
    spec = space(tmp_path, "pgjoin", 6, JOIN_ROUNDS, storage=pg.url)
    # one trial at a time per driver and none pruned: the first driver alone needs six full trials, far
    # longer than the second takes to start (at 8 rounds with ASHA, CI saw the first finish all six first)
    tree = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**tree, "scheduler": {"kind": "none"},
                                    "resources": {"cpu": 1, "max_concurrent": 1}}))
    logs = [tmp_path / "first.log", tmp_path / "joined.log"]
    with open(logs[0], "w") as first_log, open(logs[1], "w") as joined_log:
        first = subprocess.Popen([*AUTOFL, "search", "--space", str(spec), "--dir", str(home)],
                                 stdout=first_log, stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: len(trials_of_safe(pg, "pgjoin")) >= 1 or first.poll() is not None)
        started = time.monotonic()
        joined = subprocess.Popen([*AUTOFL, "search", "--join", "pgjoin", "--dir", str(home)],
                                  stdout=joined_log, stderr=subprocess.STDOUT, env=env)
        assert first.wait(timeout=900) == 0, logs[0].read_text()[-3000:]
        assert joined.wait(timeout=900) == 0, logs[1].read_text()[-3000:]
    trials = trials_of(pg, "pgjoin")
    assert len(trials) == 6 and all(t.state.is_finished() for t in trials), [t.state.name for t in trials]
    ids = [t.user_attrs["tune_trial_id"] for t in trials]
    assert len(set(ids)) == 6
    runs = [t.user_attrs["tune_run"] for t in trials]
    since_join = lambda moment: round(moment.timestamp() - time.time() + time.monotonic() - started, 1)  # noqa: E731
    ends = sorted(since_join(t.datetime_complete) for t in trials if t.user_attrs["tune_run"] == "run-1")
    joins = sorted(since_join(t.datetime_start) for t in trials if t.user_attrs["tune_run"] != "run-1")
    print(f"tune runs {runs}; after the join was launched, its trials started at {joins} s and the first "
          f"driver's ended at {ends} s")
    assert "run-1" in runs and any(r.startswith("join-") for r in runs), (runs, ends)

    proc = subprocess.run([*AUTOFL, "search", "--resume", "pgjoin", "--dir", str(home)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0 and len(trials_of(pg, "pgjoin")) == 6  # nothing left to run


def trials_of_safe(pg: PgServer, name: str):
    try:
        return trials_of(pg, name)
    except KeyError:
        return []

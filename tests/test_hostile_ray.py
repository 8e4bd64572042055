"""Issue 18, the cases that need a real Ray or PostgreSQL: resources no node has, SIGTERM, and a
PostgreSQL study whose budget the enqueued paper default must not eat (heavy: run under the
heavy lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import optuna
import pytest
import yaml

from pg_server import PgServer, serve_pg
from test_search_e2e import space_file, trials_of

pytestmark = pytest.mark.slow
AUTOFL = [sys.executable, "-m", "autofl.cli"]


def run(args, **kw):
    return subprocess.run([*AUTOFL, *map(str, args)], capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("resources", [{"cpu": 1, "gpu": 1}, {"cpu": 64}])
def test_resources_no_node_has_stop_the_search_at_once(tmp_path, resources):
    """Tune waited forever for them, silently; now: one line, exit 2, and no study left behind."""
    import torch

    if resources.get("gpu") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"study": "toobig", "trials": 1, "resources": resources,
                                    "base": {"fl": {"rounds": 1}}}))
    proc = run(["search", "--space", path, "--dir", tmp_path / "home"])  # a hang fails by the timeout
    err = proc.stderr.strip()
    field = "resources.gpu" if resources.get("gpu") else "resources.cpu"
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and field in err, err[-2000:]
    assert "Traceback" not in proc.stdout + err
    assert not (tmp_path / "home" / "toobig").exists()


def test_sigterm_stops_the_study_like_ctrl_c(tmp_path):
    home = tmp_path / "home"
    # long enough that it cannot end between the first recorded round and the signal: with 6 trials
    # of 8 rounds the last one ended 0.7 s after the first was pruned, and CI's SIGTERM came later.
    # The paper default (trial 0) is never pruned: at 1000 rounds it runs for a minute or more. The
    # signal comes once the study holds a trial's round (Tune's loop is running); waiting for a finished
    # trial took 209 s in one CI run (two trials that passed every rung together)
    space = space_file(tmp_path, "term", trials=12, rounds=1000)
    driver = subprocess.Popen([*AUTOFL, "search", "--space", str(space), "--dir", str(home)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None:
        try:
            if any(t.intermediate_values for t in trials_of(home, "term")):
                break
        except Exception:  # not created yet
            pass
        time.sleep(0.5)
    assert driver.poll() is None, "the study finished before SIGTERM; make it longer"
    driver.send_signal(signal.SIGTERM)  # what a batch scheduler or systemd sends the driver
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, err[-3000:]
    assert "resume it with autofl search --resume 'term'" in err.splitlines()[-1]
    assert "Traceback" not in err and "Aborted" not in err


def test_a_sigterm_after_the_work_ends_the_process_without_a_traceback():
    """While a study runs SIGTERM is Ctrl-C; once the command's work is done (Ray's atexit shutdown
    is all that is left) it ends the process as it would without autofl. CI saw one forwarded as
    Ctrl-C into Ray's shutdown: a KeyboardInterrupt traceback, and exit 0."""
    code = ("import os, signal\n"
            "from autofl.cli import main\n"
            "from autofl.tuning.tune.preflight import sigterm_as_ctrl_c\n"
            "sigterm_as_ctrl_c()\n"  # as a search does once Ray is up
            "assert main(['list']) == 0\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "print('still running')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert "still running" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    yield from serve_pg()


@pytest.mark.parametrize("trials", [1, 3])
def test_a_postgres_study_runs_its_paper_default_within_its_budget(pg, tmp_path, monkeypatch, trials):
    """trials: 1 on PostgreSQL ran nothing: the enqueued (WAITING) paper default counted against
    the study's shared budget before any driver took it; likewise a cross-method study with as many
    trials as methods."""
    from autofl.tuning.store import study as st
    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.strategy.space import load_space
    from autofl.tuning.tune.experiment import make_searcher

    monkeypatch.setenv("PGPASSWORD", pg.password)
    name = f"pgbudget{trials}"
    path = tmp_path / "space.yaml"
    params = {"method.name": {"type": "categorical", "choices": ["fedavg", "fedprox", "fdcl"]}} if trials == 3 else \
        {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}}
    path.write_text(yaml.safe_dump({"study": name, "trials": trials, "storage": pg.url, "params": params}))
    study = st.create_study(tmp_path / "home", path, load_space(path), None)
    ledger = Ledger(study.root)
    searcher = make_searcher(study.space(), ledger, "run-1", trials, with_start_point=True)
    ledger.add_run("run-1", trials, 2, join=False)  # as run_experiment does
    suggested = [searcher.suggest(f"t{i}") for i in range(trials)]
    assert all(isinstance(s, dict) for s in suggested), suggested
    if trials == 3:
        assert sorted(s["method.name"] for s in suggested) == ["fdcl", "fedavg", "fedprox"]
    assert searcher.suggest("extra") == "FINISHED"  # and not one more
    assert pg.password not in Path(study.root / "space.yaml").read_text()
    optuna.delete_study(study_name=name, storage=study.storage_url().replace("autofl@", f"autofl:{pg.password}@"))

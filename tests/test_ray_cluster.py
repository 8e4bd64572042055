"""A study on a real two-node Ray cluster on this machine (`ray start --head` plus a second
`ray start --address` node, one CPU each, token authentication): `autofl search --address` runs
trials on both nodes, each result records its node, and the study resumes after its driver is
killed while the cluster lives on."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
import yaml

from conftest import stop_ray_under

pytestmark = pytest.mark.slow
AUTOFL = [sys.executable, "-m", "autofl.cli"]
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="autofl-ray-")
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}",
                        *common], check=True, capture_output=True, env=env, timeout=300)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", *common], check=True, capture_output=True,
                       env=env, timeout=300)
        yield f"127.0.0.1:{port}", env
    finally:
        stop_ray_under(temp)  # this cluster's two nodes; `ray stop --force` would stop every Ray on the machine
        shutil.rmtree(temp, ignore_errors=True)


def test_study_runs_on_both_nodes_and_resumes_after_its_driver_is_killed(cluster, tmp_path):
    address, env = cluster
    home = tmp_path / "home"
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "study": "twonodes",
        "base": {"data": {"num_clients": 4, "partition": {"kind": "pathological", "classes_per_client": 3}},
                 "fl": {"rounds": 24}, "method": {"name": "fdcl"}},
        "params": {"fl.lr": {"type": "float", "low": 0.005, "high": 0.2, "log": True}},
        "trials": 6, "scheduler": {"kind": "none"}, "resources": {"cpu": 1}, "checkpoint_every_s": 0,
    }))
    # a trial trains for ~5 s: longer than a worker takes to start on the second node, so one reused
    # actor on the first node cannot drain the queue alone (8 rounds of ~1.8 s did under CI load)
    url = f"sqlite:///{home / 'twonodes' / 'optuna.db'}"

    def finished() -> int:
        try:
            return sum(t.state.is_finished() for t in optuna.load_study(study_name="twonodes", storage=url).trials)
        except Exception:  # not created yet
            return 0

    driver = subprocess.Popen([*AUTOFL, "search", "--space", str(space), "--address", address, "--dir", str(home)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None and finished() < 2:
        time.sleep(1)
    assert driver.poll() is None, "the study finished before it could be killed; make it longer"
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()

    proc = subprocess.run([*AUTOFL, "search", "--resume", "twonodes", "--address", address, "--dir", str(home)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = optuna.load_study(study_name="twonodes", storage=url).trials
    real = [t for t in trials if not t.user_attrs.get("interrupted")]
    assert all(t.state.is_finished() for t in trials) and len(real) == 6
    assert all(t.state.name == "COMPLETE" for t in real), [t.state.name for t in real]
    nodes = {t.user_attrs["node_id"] for t in real}
    assert len(nodes) == 2, nodes  # both nodes trained trials
    status = subprocess.run([*AUTOFL, "status", "twonodes", "--dir", str(home)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert status.returncode == 0 and all(n[:8] in status.stdout for n in nodes)

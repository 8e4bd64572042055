"""`autofl dashboard NAME` serves optuna-dashboard on the study's storage at 127.0.0.1: a test
starts it on a free port, reads the study through its HTTP API and stops it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import pytest
import yaml

pytest.importorskip("optuna_dashboard", reason="the dashboard extra is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_serves_the_study_on_localhost(tmp_path):
    home = tmp_path / "home"
    root = home / "dash"
    root.mkdir(parents=True)
    (root / "space.yaml").write_text(yaml.safe_dump({"study": "dash"}))
    ot = optuna.create_study(study_name="dash", storage=f"sqlite:///{root / 'optuna.db'}", direction="maximize")
    ot.optimize(lambda t: t.suggest_float("fl.lr", 0.001, 1.0), n_trials=3)

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "autofl.cli", "dashboard", "dash", "--port", str(port),
                               "--dir", str(home)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        studies = None
        deadline = time.time() + 60
        while time.time() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as reply:
                    studies = json.loads(reply.read())
                break
            except OSError:
                time.sleep(0.3)
        assert studies is not None, server.stdout.read() if server.poll() is not None else "no answer"
        (study,) = [s for s in studies["study_summaries"] if s["study_name"] == "dash"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", timeout=5) as reply:
            detail = json.loads(reply.read())
        assert len(detail["trials"]) == 3 and detail["trials"][0]["params"][0]["name"] == "fl.lr"
        with pytest.raises(OSError):  # bound to 127.0.0.1 only: another address of this machine is refused
            other = socket.gethostbyname(socket.gethostname())
            if other.startswith("127."):
                raise OSError("no non-loopback address to try")
            socket.create_connection((other, port), timeout=3).close()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert server.returncode is not None

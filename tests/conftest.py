import json
import os
from pathlib import Path

import optuna
import pytest

from autofl.cli import main

# Optuna makes its log handler at its first log line, on the sys.stderr of that moment: inside a test that
# captures output (capsys), a stream closed when that test ends, and every later Optuna line in the process
# then writes "--- Logging error ---" into the next test's captured stderr (test_hostile_input.py alone
# failed 4 tests so). Made here, the handler holds the session's stream.
optuna.logging.set_verbosity(optuna.logging.get_verbosity())


@pytest.fixture
def run_cli():
    """Run the autofl CLI in-process and return its exit code."""
    return lambda *args: main([str(a) for a in args])


def read_metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal, for the tests that send themselves a
    Ctrl-C: a suite started in the background by a shell without job control (`cmd &`, nohup) inherits SIGINT
    ignored, and Python then keeps it ignored. The disposition the process had is put back afterwards."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def data_root() -> Path:
    root = os.environ.get("AUTOFL_DATA_ROOT")
    if not root:
        pytest.skip("AUTOFL_DATA_ROOT is not set (CI sets it to ../shared/datasets when that folder exists)")
    return Path(root)


EXAMPLE_PLUGIN = "examples/autofl-example-plugin"


def require_example_plugin() -> None:
    """Skip when the example plugin is not installed; under CI (env CI set, where .ci/run installs
    it) its absence is a failure, not a skip."""
    from autofl.registry import METHODS

    if "lg_fedavg" in METHODS and METHODS.source("lg_fedavg") == "autofl-example-plugin":
        return
    message = f"the example plugin is not installed (pip install -e {EXAMPLE_PLUGIN})"
    if os.environ.get("CI"):
        pytest.fail(message + "; .ci/run installs it")
    pytest.skip(message)


def spy_whole_steps(monkeypatch, cls) -> list[tuple[int, int, object]]:
    """Record every call of the vectorized executor's compiled whole step, `cls.whole_step`
    (`vectorized._Step`: one update; `vectorized._StageStep`: a stage's updates in one call), as
    (clients training, clients stacked, the step's batch rows), and run it."""
    original = cls.whole_step
    calls: list[tuple[int, int, object]] = []

    def recorded(self, hi, rows, opt):
        calls.append((hi, self.run.k, rows))
        return original(self, hi, rows, opt)

    monkeypatch.setattr(cls, "whole_step", recorded)
    return calls


STORAGE_KINDS = ("sqlite", "journal")  # the storages every storage-generic test runs on (PostgreSQL: test_postgres)


def start_ray_without_ray(root, address, verbose, meanwhile=None) -> Path:
    """`ray_start.start_ray` for tests that run no Ray: what it runs beside Ray's start (`meanwhile`: the
    trial stack's imports and the space's resources) runs here, as the real one runs it in a thread."""
    if meanwhile is not None:
        meanwhile()
    return Path(root) / "logs"


def storage_line(kind: str) -> str:
    """The space file's `storage:` line for a storage kind: none (SQLite in the study folder) or a
    journal file in the study folder."""
    return "storage: journal://optuna.log\n" if kind == "journal" else ""


def new_ledger(tmp_path: Path, storage: str = "sqlite"):
    """A study ledger on a fresh single-objective (maximize) study in tmp_path/s, on `storage`
    (one of STORAGE_KINDS)."""
    from autofl.tuning.store.ledger import Ledger

    root = tmp_path / "s"
    root.mkdir()
    (root / "space.yaml").write_text("study: s\n" + storage_line(storage))
    ledger = Ledger(root)
    ledger.study(create_directions=["maximize"])
    return ledger


def processes() -> dict[int, tuple[int, bytes]]:
    """Every process of this machine: pid -> (parent pid, command line)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        table[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return table


def with_descendants(roots: set[int], table: dict[int, tuple[int, bytes]]) -> set[int]:
    """`roots` and every process under them in `table` (`processes()`)."""
    found, grew = set(roots), True
    while grew:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def _kill_and_wait(pids: set[int], timeout: float = 60.0) -> None:
    import signal
    import time

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pids & set(processes()):
        time.sleep(0.1)


def kill_driver_and_its_ray(proc) -> None:
    """SIGKILL a driver started with `start_new_session=True`, its process group, and every process
    under it: the local Ray it started (gcs_server, raylet, agents, and trial workers, which run in
    process groups of their own). Only this driver's: `ray stop --force` would stop every Ray on the
    machine, a developer's other runs included."""
    import signal

    tree = with_descendants({proc.pid}, processes())
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    _kill_and_wait(tree - {proc.pid})


def stop_ray_under(temp_dir: str) -> None:
    """Stop the Ray whose temp dir is `temp_dir` (`ray start --temp-dir`): the processes whose command
    line names it (gcs_server, raylet, Ray's daemons) and every process under them (agents and workers,
    retitled `ray::...`); no other Ray."""
    table = processes()
    marker = temp_dir.encode()
    _kill_and_wait(with_descendants({pid for pid, (_, cmd) in table.items() if marker in cmd}, table))

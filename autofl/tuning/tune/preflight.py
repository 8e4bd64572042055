"""Checks a search runs before it makes or waits on anything: a Ray address that answers, a
`--storage-path` Tune can write, trial resources some node has, and how many trials the memory
holds at once. Each failure is one line naming the field and what to do (exit 2), within seconds:
nothing here waits longer than PROBE_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Literal

from autofl.errors import AutoFLError, ConfigError

PROBE_TIMEOUT_S = 3.0
DEFAULT_GCS_PORT = 6379  # `ray start --head`'s default
# what one trial process costs at least (torch, the engine, a small model and its data): measured
# about 0.75 GB per worker on CPU; a space whose `cpu:` share is tiny would otherwise start a worker
# per share and exhaust the memory long before the cores
TRIAL_MEMORY_BYTES = int(float(os.environ.get("AUTOFL_TRIAL_MEMORY_GB", "1.0")) * (1 << 30))


def address_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) a Ray `--address` names, or None for addresses with no fixed endpoint
    (`auto`, `local`). Raises ConfigError for a malformed one."""
    text = address.strip()
    if text in ("auto", "local"):
        return None
    for scheme in ("ray://", "http://", "https://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    text = text.rstrip("/")
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = text, str(DEFAULT_GCS_PORT)
    host = host.strip("[]")
    hostname = re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?|[0-9A-Fa-f:.]+", host)
    if not hostname or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"--address {address!r}: not a Ray address; allowed: HOST:PORT (e.g. 10.0.0.5:6379), "
            f"ray://HOST:PORT, or auto"
        )
    return host, int(port_text)


def probe_address(address: str | None) -> None:
    """A TCP connection to the address's port, with a short timeout: an unreachable cluster is one
    line within seconds instead of Ray's minutes of retries (and before any study folder exists)."""
    if address is None:
        return
    endpoint = address_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=PROBE_TIMEOUT_S) as conn:
            speaks_grpc = answers_http2(conn)
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        raise AutoFLError(
            f"--address {address}: nothing answers at {endpoint[0]}:{endpoint[1]} ({reason}); start "
            f"the cluster there (ray start --head) or leave --address out to run a local Ray"
        ) from None
    if not speaks_grpc and os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
        # issue 42: Ray's C++ client retried such a port for minutes, printing warnings, deaf to SIGTERM
        raise AutoFLError(
            f"--address {address}: {endpoint[0]}:{endpoint[1]} answers, but not as Ray (no gRPC "
            f"handshake within {PROBE_TIMEOUT_S:g} s: another service, e.g. a database, is on that "
            f"port); give the Ray head's GCS port (ray start --head prints it; default 6379) or "
            f"ray://HOST:10001"
        )


# an HTTP/2 client's connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def answers_http2(conn: socket.socket) -> bool:
    """Whether the server on `conn` answers an HTTP/2 preface with a SETTINGS frame on stream 0, as
    every gRPC server does (Ray's GCS and Ray Client serve gRPC); a database or a plain TCP server
    says something else, closes, or stays silent until PROBE_TIMEOUT_S."""
    conn.settimeout(PROBE_TIMEOUT_S)
    try:
        conn.sendall(HTTP2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    except OSError:  # timed out, reset
        return False
    return head[3] == 4 and int.from_bytes(head[5:9], "big") & 0x7FFFFFFF == 0


def check_storage_path(path: str | None, field: str = "--storage-path") -> str | None:
    """`path` as Tune needs it: a local folder made absolute (Tune refuses relative ones), not a
    file, under a folder this user may write; or a URI pyarrow knows (s3://, gs://, file://)."""
    if path is None:
        return None
    if not path.strip():
        raise ConfigError(f"{field}: empty; allowed: a folder or a URI such as s3://bucket/prefix")
    if "://" in path:
        if path.startswith("file://"):
            check_storage_path(path[len("file://") :] or "/", field)
            return path
        import pyarrow.fs

        try:
            pyarrow.fs.FileSystem.from_uri(path)
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a URI it cannot use
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"{field}: {path!r} cannot be used ({reason}); allowed: a folder, or a URI such as "
                f"s3://bucket/prefix, gs://bucket/prefix"
            ) from None
        return path
    folder = Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{field}: {path} is a file; give a folder every Ray node reaches")
    ancestor = folder
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{field}: {path} cannot be made here ({ancestor} is not a folder you may write); "
            f"give a folder you may write"
        )
    return str(folder)


def node_resources() -> list[dict[str, float]]:
    """Each live Ray node's resources (after Ray started; none before)."""
    import ray

    if not ray.is_initialized():
        return []
    # a node that has just joined may not have reported its resources yet (no "CPU" key): judging
    # it then would refuse a trial it can hold, so give the nodes a few seconds to report
    deadline = time.monotonic() + 10
    while True:
        nodes = [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
        if (nodes and all("CPU" in n for n in nodes)) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.2)


def check_trial_fits(cpu: float, gpu: float, nodes: list[dict[str, Any]], address: str | None) -> None:
    """Refuse trial resources that no node of the cluster has (Tune would wait for them forever,
    silently). Locally, one node must hold a whole trial; on a cluster (`--address`, maybe
    autoscaling) its totals are checked."""
    if not nodes:
        return
    if address is None:
        fits = any(n.get("CPU", 0.0) >= cpu and n.get("GPU", 0.0) >= gpu for n in nodes)
        have = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)))
        where = "this machine has"
    else:
        have = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
        fits = have["CPU"] >= cpu and have["GPU"] >= gpu
        where = f"the cluster at {address} has"
    if fits:
        return
    has_cpu, has_gpu = have.get("CPU", 0.0), have.get("GPU", 0.0)
    if gpu > has_gpu:
        allowed = "resources.gpu: 0 (train on the CPU)" if has_gpu == 0 else f"resources.gpu up to {has_gpu:g}"
        raise ConfigError(
            f"resources.gpu: a trial asks for {gpu:g} GPU but {where} {has_gpu:g}; allowed: {allowed}, "
            f"or --address a cluster with GPUs"
        )
    raise ConfigError(
        f"resources.cpu: a trial asks for {cpu:g} CPUs but {where} {has_cpu:g}; allowed: "
        f"resources.cpu up to {has_cpu:g}"
    )


def check_cluster_fits(cpu: float, gpu: float, address: str | None) -> None:
    """check_trial_fits against the running Ray (call right after Ray starts, before any trial)."""
    check_trial_fits(cpu, gpu, node_resources(), address)


def memory_slots(resources: dict[str, float]) -> int | None:
    """Trials the cluster's memory holds at once at TRIAL_MEMORY_BYTES each (None: Ray reported
    no memory)."""
    memory = resources.get("memory")
    if not memory:
        return None
    return max(1, int(memory // TRIAL_MEMORY_BYTES))


def sigterm_as_ctrl_c() -> None:
    """SIGTERM (batch schedulers, systemd, `kill`) does what Ctrl-C does: Tune saves the experiment
    and the study resumes with --resume (exit 130). Ray's driver installs its own SIGTERM handler
    when it connects, so call this again after Ray starts."""

    def forward(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)  # Tune's graceful stop while it runs, else KeyboardInterrupt
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    _set_sigterm(forward)


def sigterm_ends_the_process() -> None:
    """Undoes `sigterm_as_ctrl_c` once the CLI's command is done (its trials and runs are stored): a
    SIGTERM from then on ends the process at once, as it does without autofl, instead of being
    forwarded as Ctrl-C into Ray's atexit shutdown, where it printed a KeyboardInterrupt traceback and
    the process still exited 0 (CI saw a SIGTERM land there, just after a study's last trial). Only
    the CLI calls it: it owns its process, where a Python caller of the API owns theirs."""
    _set_sigterm(signal.SIG_DFL)


def _set_sigterm(handler: Any) -> None:
    """SIGTERM's handler set to `handler`, from the main thread only: Python sets signal handlers there
    alone (elsewhere, as in a Python caller's worker thread, the handler stays as it is)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def check_home(home: Path) -> None:
    """The studies folder ($AUTOFL_HOME or --dir) can hold a new study: a folder (or one that can be
    made) this user may write."""
    ancestor = home
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"studies folder {home}: {ancestor} is a file; set AUTOFL_HOME or --dir to a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(
            f"studies folder {home}: {ancestor} is not writable; set AUTOFL_HOME or --dir to a folder you may write"
        )


def check_new_study(space: Any, storage_path: str | None) -> str | None:
    """What a new study's start can check before its folder exists: the `--storage-path` (returned
    absolute) and the space's `storage_path`."""
    if space.storage_path is not None:
        checked = check_storage_path(space.storage_path, "storage_path")
        if "://" not in space.storage_path and checked != space.storage_path:
            raise ConfigError(
                f"storage_path: {space.storage_path!r} is relative; allowed: an absolute folder "
                f"(every Ray node must reach it) or a URI such as s3://bucket/prefix"
            )
    return check_storage_path(storage_path)


# what a study's start makes in its folder: removed again when the start fails before any trial
_MADE_AT_START = (
    "space.yaml",
    "study.json",
    "driver.lock",
    "logs",
    "optuna.db",
    "optuna.db-wal",
    "optuna.db-shm",
    "tune",
)


class rollback_if_unstarted:  # noqa: N801 - used as a context manager
    """Around the steps between creating a study and its first run (Ray's start, the resource
    check): if one fails, a study this command created is removed again (only the files a start
    makes: a folder that held other files keeps them), so no half-made study is left; Ray's own
    errors become one line."""

    def __init__(self, study: Any, created: bool, lock: Any):
        self.study, self.created, self.lock = study, created, lock

    def __enter__(self) -> rollback_if_unstarted:
        return self

    def __exit__(self, kind: Any, err: BaseException | None, tb: Any) -> Literal[False]:
        if err is None:
            return False
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except Exception:  # noqa: BLE001 - best effort: the process is ending with the error below
            pass
        self.lock.release()
        if self.created:
            root = Path(self.study.root)
            for name in _MADE_AT_START:
                target = root / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target, ignore_errors=True)
                elif target.exists() or target.is_symlink():
                    target.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                root.rmdir()  # only if nothing else is in it
        if isinstance(err, (AutoFLError, KeyboardInterrupt)):
            return False
        reason = " ".join(str(err).split()) or type(err).__name__
        made = "nothing was kept" if self.created else "the study is unchanged"
        raise AutoFLError(
            f"ray: could not start ({reason[:300]}); {made}; see the Ray logs under /tmp/ray and retry"
        ) from None


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """A port a server can listen on here: 1..65535 and not taken."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: not a port; allowed: 1..65535")
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            raise AutoFLError(
                f"--port {port}: cannot listen on {host}:{port} ({err.strerror}); pick another "
                f"port, e.g. --port {port + 1}"
            ) from None

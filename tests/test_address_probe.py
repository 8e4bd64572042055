"""`--address` at a port where something other than Ray answers (issue 42: a PostgreSQL port hung
over 120 s, printing Ray's C++ warnings, deaf to SIGTERM): one line, exit 2, before any study
folder exists. The servers are plain sockets on 127.0.0.1 that the test starts and stops."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from test_search_e2e import space_file

AUTOFL = [sys.executable, "-m", "autofl.cli"]


@contextmanager
def tcp_server(reply: bytes | None) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts and sends `reply` (None: says nothing); its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop, held = threading.Event(), []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if reply is not None:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


# what PostgreSQL answers a client that does not speak its protocol: an ErrorResponse
PG_LIKE = b"E\x00\x00\x00\x5cSFATAL\x00VFATAL\x00C0A000\x00Munsupported frontend protocol\x00\x00"


@pytest.mark.parametrize("reply", [None, PG_LIKE, b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_an_address_where_something_else_answers_is_one_line(tmp_path, reply):
    with tcp_server(reply) as port:
        proc = subprocess.run([*AUTOFL, "search", "--space", str(space_file(tmp_path, "addr", trials=1, rounds=1)),
                               "--dir", str(tmp_path / "home"), "--address", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "not as Ray" in proc.stderr and str(port) in proc.stderr, proc.stderr
    assert not (tmp_path / "home" / "addr").exists()


def test_a_grpc_server_passes_the_handshake_check():
    """The check Ray's GCS passes (answered on a live Ray in the search tests): a SETTINGS frame."""
    from autofl.tuning.tune.preflight import answers_http2

    settings = bytes([0, 0, 0x18, 4, 0, 0, 0, 0, 0])
    with tcp_server(settings) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        assert answers_http2(conn)
    with tcp_server(PG_LIKE) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        assert not answers_http2(conn)

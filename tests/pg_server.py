"""A throw-away PostgreSQL server for tests: Debian's binaries, `initdb` + `pg_ctl` in a temp folder,
listening on 127.0.0.1 only (and a private socket folder), a free port, password authentication."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

PASSWORD = "pg-S3cret-autofl-7f3a"  # tests grep every output and every study file for it


@dataclass
class PgServer:
    host: str
    port: int
    user: str
    database: str
    password: str

    @property
    def url(self) -> str:
        """Without the password (as a space file must hold it)."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def url_with_password(self) -> str:
        return f"postgresql+psycopg://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"


def server_binaries() -> Path | None:
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgProcess:
    """Start with `start()`, stop with `stop()`; as root, the server runs as the `postgres` user
    (initdb refuses root)."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.folder = Path(tempfile.mkdtemp(prefix="autofl-pg-"))
        self.data = self.folder / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            import pwd

            pg = pwd.getpwnam("postgres")  # KeyError: no such user (the caller skips)
            os.chown(self.folder, pg.pw_uid, pg.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> PgServer:
        pwfile = self.folder / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_user:
            import pwd

            pg = pwd.getpwnam("postgres")
            os.chown(pwfile, pg.pw_uid, pg.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "autofl", "-A", "scram-sha-256",
                  f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8", "--locale=C")
        pwfile.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -F"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="autofl", password=PASSWORD,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE autofl")
        return PgServer("127.0.0.1", self.port, "autofl", "autofl", PASSWORD)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                            "-w", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(self.folder, ignore_errors=True)


def serve_pg() -> Iterator[PgServer]:
    """A real PostgreSQL server on 127.0.0.1 for a test module's `pg` fixture: skips where none can
    run here, and is stopped when the module is done."""
    import pytest

    bindir = server_binaries()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql "
                    "(.ci/run does this when it can)")
    try:
        process = PgProcess(bindir)
    except KeyError:
        pytest.skip("running as root and there is no `postgres` user to run the server as")
    try:
        yield process.start()
    finally:
        process.stop()

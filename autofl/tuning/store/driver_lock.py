"""One main driver per study folder, held for the driver's life.

`autofl search` (new study, `--resume`, adding trials) takes an exclusive `flock` on
`<study>/driver.lock`; the kernel releases it when the driver exits or is killed, so a crashed
driver never leaves a stale lock. A second main driver is refused at start: on SQLite because one
file cannot take two drivers' writes, and on any storage because two drivers restoring the same
Tune experiment would train its trials twice. `--join` drivers (PostgreSQL, a journal) do not take it:
they run their own Tune experiment on the same Optuna study.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import IO

from autofl.errors import StorageError
from autofl.files import open_no_follow

LOCK_FILE = "driver.lock"


class DriverLock:
    def __init__(self, study_root: Path):
        self.path = study_root / LOCK_FILE
        self._file: IO[str] | None = None

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return "another process"
        return f"pid {info.get('pid', '?')} on {info.get('host', '?')}"

    def is_held(self) -> bool:
        """Whether a live driver holds the lock now (a killed one's lock is gone with it)."""
        if not self.path.exists() or self.path.is_symlink():  # a planted link is no driver's lock
            return False
        with os.fdopen(open_no_follow(self.path), "r") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
        return False

    def acquire(self, sqlite: bool) -> None:
        try:  # never through a link planted in the study folder (it would truncate the link's target)
            handle = os.fdopen(open_no_follow(self.path, "a"), "r+")
        except OSError as err:
            raise StorageError(
                f"{self.path}: cannot be opened as the study's lock file ({err.strerror}); "
                f"if it is a symbolic link, remove it"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            name = self.path.parent.name
            instead = (
                f"SQLite takes one driver per study: wait for it to end (or stop it), or create the study "
                f"on PostgreSQL or journal storage and add drivers with --join {name}"
                if sqlite
                else f"wait for it to end, or add a driver with --join {name}"
            )
            raise StorageError(f"study {name!r} has a running driver ({self.holder()}); {instead}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

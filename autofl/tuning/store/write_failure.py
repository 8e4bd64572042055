"""A write that failed for lack of space or a read-only file system during a search (issue 42):
recognised in an error or the errors it was raised from, noted when Tune swallows it (Tune logs what
its searcher raises and goes on), and reported as one line (exit 2) that says how to go on."""

from __future__ import annotations

import errno

from autofl.errors import StorageError

WRITE_ERRNOS = {"ENOSPC", "EROFS", "EDQUOT"}
# what SQLite (through SQLAlchemy and Optuna) says for the same causes
WRITE_MESSAGES = (
    "database or disk is full",
    "attempt to write a readonly database",
    "No space left on device",
    "Read-only file system",
    "Disk quota exceeded",
)

_noted: list[str] = []  # failed writes this process saw while Tune ran


class WriteFailed(StorageError):
    """A write of the study failed; the study is as it was before it, and resumes."""

    @classmethod
    def of(cls, study_name: str, reason: str) -> WriteFailed:
        return cls(
            f"study {study_name!r}: a write failed ({reason}); the study is as it was before that write: "
            f"free space (or make it writable), then resume it with autofl search --resume {study_name!r}"
        )


def failed_write(err: BaseException) -> str | None:
    """Why `err`, or an error it was raised from or while handling, is a write that failed for lack
    of space or a read-only file system: a short reason, else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and errno.errorcode.get(current.errno or -1) in WRITE_ERRNOS:
            where = f": {current.filename}" if current.filename else ""
            return f"{current.strerror or errno.errorcode.get(current.errno or -1, '')}{where}"
        text = str(current)
        for message in WRITE_MESSAGES:
            if message in text:
                return message
        current = current.__cause__ or current.__context__
    return None


def note(err: BaseException) -> None:
    """Remember `err` if it is a failed write (called where Tune would swallow it)."""
    reason = failed_write(err)
    if reason is not None:
        _noted.append(reason)


def forget() -> None:
    _noted.clear()


def first_noted() -> str | None:
    return _noted[0] if _noted else None

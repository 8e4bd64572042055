"""Writing files so that a kill never leaves one half-written, and never through a symbolic link
someone planted in a study or run folder (a link named like our temp file or lock file would
otherwise make us overwrite its target). Every file autofl writes (exported configs, reports, a
run's files, a study's own) goes through `write_atomic`: only a new path or a regular file is
written, never a symbolic link, FIFO, device or folder there (issue 42: `-o /dev/null --overwrite`
as root would have replaced the machine's /dev/null)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from autofl.errors import OutputError

_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _create_exclusive(path: Path) -> int:
    """A new file at `path` for writing, never a link's target: O_EXCL|O_NOFOLLOW; a leftover
    temp file (a killed writer) or a planted link is removed first (the link, not its target)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, 0o644)


def not_a_regular_file(path: Path) -> str | None:
    """What `path` is if it is there and not a regular file (a link is not followed), else None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def check_output_file(path: Path, flag: str = "") -> None:
    """OutputError (one line, naming `flag` and `path`) unless `path` is new or a regular file."""
    what = not_a_regular_file(Path(path))
    if what is not None:
        raise OutputError(
            f"{flag + ' ' if flag else ''}{path}: is {what}; autofl writes its output only as a new "
            f"or regular file, never through or over a link, FIFO or device; give another name"
        )


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` to a sibling temp file, then rename it over `path` (a reader sees the old file
    or the new one, never a part). Only a new path or a regular file is replaced: a symbolic link,
    FIFO, device or folder at `path` is OutputError, left as it was."""
    path = Path(path)
    check_output_file(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = _create_exclusive(tmp)
    except OSError as err:
        raise write_failed(path, err) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())  # a full disk shows here, not after the rename
        os.replace(tmp, path)
    except OSError as err:  # disk full, read-only, no permission: the temp file goes, `path` is as it was
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise write_failed(path, err) from None


def write_failed(path: Path, err: OSError) -> OutputError:
    """One line for a write that failed: the path and the cause (issue 42: a full disk was reported
    as a closed output pipe, and left its temp file)."""
    causes = {
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exhausted",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
    }
    cause = causes.get(err.errno or 0) or err.strerror or type(err).__name__
    return OutputError(f"{path}: cannot be written: {cause}; nothing was written there")


def open_no_follow(path: Path, mode: str = "r") -> int:
    """A file descriptor for `path` that is never a symbolic link's target (OSError ELOOP if `path`
    is a link). `mode`: "r" to read, "a" to create or append."""
    flags = (os.O_RDWR | os.O_CREAT) if mode == "a" else os.O_RDONLY
    return os.open(path, flags | _NO_FOLLOW, 0o644)

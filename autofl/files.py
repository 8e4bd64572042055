"""Writing files so that a kill never leaves one half-written, and never through a symbolic link
someone planted in a study or run folder (a link named like our temp file or lock file would
otherwise make us overwrite its target)."""

from __future__ import annotations

import os
from pathlib import Path

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


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` to a sibling temp file, then rename it over `path` (a reader sees the old file
    or the new one, never a part). A symbolic link at `path` is replaced, its target untouched."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = _create_exclusive(tmp)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def open_no_follow(path: Path, mode: str = "r") -> int:
    """A file descriptor for `path` that is never a symbolic link's target (OSError ELOOP if `path`
    is a link). `mode`: "r" to read, "a" to create or append."""
    flags = (os.O_RDWR | os.O_CREAT) if mode == "a" else os.O_RDONLY
    return os.open(path, flags | _NO_FOLLOW, 0o644)

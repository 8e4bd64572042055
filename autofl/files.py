"""Writing files so that a kill never leaves one half-written."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a sibling temp file, then rename it over `path` (a reader sees the old file
    or the new one, never a part)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

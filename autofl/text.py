"""Terminal-safe text: what autofl prints of user input (names, paths, parameter values, error
messages) is shown as text, never interpreted. The consoles take no rich markup (`[/x]` in a path
crashed rich; `configs[v2].yaml` lost its `[v2]`), and control characters (ANSI escapes, carriage
returns, bidi overrides that reverse what follows) are shown escaped instead of acting on the
terminal."""

from __future__ import annotations

import sys
import unicodedata

from rich.console import Console

# bidi embeddings/overrides/isolates and marks: they reorder the text shown after them
_BIDI = {"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}


def _unsafe(char: str) -> bool:
    return char in _BIDI or (unicodedata.category(char) == "Cc" and char not in "\n\t")


def clean(text: object) -> str:
    """`text` as a string whose control and bidi characters are written as escapes (`\\x1b`)."""
    value = str(text)
    if not any(_unsafe(c) for c in value):
        return value
    return "".join(c.encode("unicode_escape").decode("ascii") if _unsafe(c) else c for c in value)


class SafeConsole(Console):
    """A Console whose printed strings are `clean`ed (renderables such as tables clean their cells)."""

    def print(self, *objects: object, **kwargs: object) -> None:
        super().print(*(clean(o) if isinstance(o, str) else o for o in objects), **kwargs)  # type: ignore[arg-type]


def terminal_console(stderr: bool = False) -> Console:
    """A rich Console for autofl's output: no markup or emoji codes in printed strings; in a pipe or
    CI log, 200 columns instead of rich's 80 (tables would wrap)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream is not None and stream.isatty() else 200  # stdout may be closed (>&-)
    return SafeConsole(stderr=stderr, width=width, markup=False, emoji=False)

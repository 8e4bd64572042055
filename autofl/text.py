"""Terminal-safe text: what autofl prints of user input (names, paths, parameter values, error
messages) is shown as text, never interpreted. The consoles take no rich markup (`[/x]` in a path
crashed rich; `configs[v2].yaml` lost its `[v2]`), and control characters (ANSI escapes, carriage
returns, bidi overrides that reverse what follows) are shown escaped instead of acting on the
terminal."""

from __future__ import annotations

import re
import sys
import unicodedata
from urllib.parse import unquote_plus

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


# ----- secrets: a storage URL's password is never printed ------------------------------------------

_PASSWORD_IN_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<password>[^@\s]*)@")
# libpq's other form: the password as a query parameter (`?password=...`, any case, percent-encoded
# or not; `sslpassword` too), and keyword/value connection strings (`password=... host=...`)
_QUERY_PARAM = re.compile(r"(?P<head>(?:^|[?&;\s'\"(,])(?P<key>[^=&;?\s'\"(,]+)\s*=\s*)(?P<value>'[^']*'|[^&;\s'\")]*)")


def is_secret_key(key: str) -> bool:
    """Whether a URL query key or a libpq keyword carries a password (`password`, `PASSWORD`,
    `pass%77ord`, `sslpassword`)."""
    return "password" in unquote_plus(key).lower()


def mask_url(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***` (user:pw@ and ?password= forms)."""
    text = _PASSWORD_IN_URL.sub(lambda m: f"{m.group('head')}***@", text)
    return _QUERY_PARAM.sub(lambda m: f"{m.group('head')}***" if is_secret_key(m.group("key")) else m.group(0), text)

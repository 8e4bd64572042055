"""User-facing errors: one line, naming the field and what is allowed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


class AutoFLError(Exception):
    """An error caused by user input; the CLI prints it as one line and exits with code 2."""

    exit_code = 2


class ConfigError(AutoFLError):
    """A config or search-space file that does not validate."""


class DataError(AutoFLError):
    """A dataset that cannot be found or loaded."""


class OutputError(AutoFLError):
    """An output path that may not or cannot be written (a link, FIFO or device there; a full or
    read-only disk)."""


class RunDiverged(AutoFLError):
    """Training produced a non-finite loss: not bad input, so exit code 1."""

    exit_code = 1


class MethodDefinitionError(AutoFLError):
    """A method whose declarations contradict what it does (a method author's mistake, e.g. an
    `Update` training a workspace copy that nothing keeps)."""


class StorageError(AutoFLError):
    """A study storage that cannot be opened, or a driver that may not run on it now."""


def _submodel_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """Follow `loc` through nested pydantic models; return the model that owns the last key."""
    current: Any = model
    for key in loc[:-1]:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(key))
        if field is None:
            return None
        current = field.annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        return current
    return None


def format_validation_error(err: ValidationError, root: type[BaseModel], prefix: str = "", context: str = "") -> str:
    """Turn pydantic's multi-line error into one line: `key: problem (got value)`."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    key = prefix + ".".join(str(part) for part in loc)
    if first["type"] == "extra_forbidden":
        owner = _submodel_at(root, loc)
        allowed = (", ".join(owner.model_fields) or "(none)") if owner is not None else "see the documentation"
        return f"{key}: unknown key{context}; allowed keys: {allowed}"
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if not loc:  # a cross-field check: its message already names the key
        return msg
    got = first.get("input")
    got_text = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
    more = len(err.errors()) - 1
    tail = f" [+{more} more error{'s' if more > 1 else ''}]" if more else ""
    return f"{key}: {msg}{got_text}{tail}"


class ArgumentError(AutoFLError):
    """A Python API argument of the wrong type or out of range (autofl/api_args.py)."""

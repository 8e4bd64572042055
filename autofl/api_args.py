"""The Python API's arguments, validated as the CLI validates its flags: one pydantic model per
call (strict: `trials="3"` or `trials=1.5` is refused, not coerced), checked before any work
starts, so that nothing is written for a bad argument. A bad argument raises `ArgumentError`
(an AutoFLError) naming the call, the argument and what it allows:

    search: trials=1.5 is not allowed; allowed: a whole number from 1 to 100000, or None

`config` and `space` are checked by the calls themselves (a dict, a pydantic object or a YAML
path; ConfigError naming them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autofl.errors import ArgumentError

PATH = "a path (str or pathlib.Path)"
OPTIONAL_PATH = f"{PATH}, or None"
FLAG = "True or False"
CALLBACK = "a callable, or None"
REEVAL_KEYS = ("best", "rows", "seeds", "verdict", "vary_partition")
MAX_TRIALS = 100_000  # as `autofl search --trials`


class _Args(BaseModel):
    """Strict: an argument is taken as given or refused (no "3" -> 3, no 1.5 -> 1)."""

    model_config = ConfigDict(strict=True, extra="forbid", arbitrary_types_allowed=True)


class TrainArgs(_Args):
    out: str | Path | None = Field(
        None, description=f"the run's folder, {OPTIONAL_PATH} for autofl_runs/<method>-<time>"
    )
    overwrite: bool = Field(False, description=FLAG)
    overrides: list[str] | tuple[str, ...] = Field((), description="a list of 'key=value' strings")
    on_round: Callable[..., Any] | None = Field(None, description=CALLBACK)
    announce: Callable[..., Any] | None = Field(None, description=CALLBACK)
    on_clients: Callable[..., Any] | None = Field(None, description=CALLBACK)


class LoadConfigArgs(_Args):
    overrides: list[str] | tuple[str, ...] = Field((), description="a list of 'key=value' strings")


class DirArgs(_Args):
    dir: str | Path | None = Field(None, description=f"the studies folder, {OPTIONAL_PATH} for $AUTOFL_HOME")


class LoadStudyArgs(DirArgs):
    name: str = Field(description="a study name (str)")


class SearchArgs(DirArgs):
    name: str | None = Field(None, description="a study name (str), or None for the space's `study`")
    trials: int | None = Field(
        None, ge=1, le=MAX_TRIALS, description=f"a whole number from 1 to {MAX_TRIALS}, or None for the space's"
    )
    address: str | None = Field(None, description="a Ray address (str), or None to start a local Ray")
    resume: bool = Field(False, description=FLAG)
    join: bool = Field(False, description=FLAG)
    storage_path: str | None = Field(None, description="a folder or URI (str), or None for the study folder")
    warm_start: str | None = Field(
        None, description="the name (str) of another study in the same studies folder, or None"
    )
    verbose: bool = Field(False, description=FLAG)
    on_start: Callable[..., Any] | None = Field(None, description=CALLBACK)


class SlurmArgs(DirArgs):
    name: str | None = Field(None, description="a study name (str), or None for the space's `study`")
    resume: bool = Field(False, description=FLAG)
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS, description=f"a whole number from 1 to {MAX_TRIALS}, or None")
    dry_run: bool = Field(False, description=FLAG)


class ReevaluateArgs(_Args):
    seeds: int = Field(5, ge=2, description="a whole number of 2 or more")
    top: int = Field(3, ge=1, description="a whole number of 1 or more")
    vary_partition: bool = Field(False, description=FLAG)
    address: str | None = Field(None, description="a Ray address (str), or None to start a local Ray")
    verbose: bool = Field(False, description=FLAG)
    on_plan: Callable[..., Any] | None = Field(None, description=CALLBACK)
    on_done: Callable[..., Any] | None = Field(None, description=CALLBACK)


class ReportArgs(_Args):
    out: str | Path | None = Field(None, description=f"the report's folder, {OPTIONAL_PATH} for <study>/report")


class BestConfigArgs(_Args):
    reeval: dict[str, Any] | None = Field(
        None,
        description="a re-evaluation summary as Study.reevaluate returns "
        f"it (keys {', '.join(REEVAL_KEYS)}), or None for the stored one",
    )

    @field_validator("reeval")
    @classmethod
    def _a_summary(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and (not set(REEVAL_KEYS) <= set(value) or not isinstance(value["rows"], list)):
            raise ValueError("not a re-evaluation summary")
        return value


class RowsArgs(_Args):
    rows: list[dict[str, Any]] | None = Field(None, description="rows as Study.trials() returns them, or None")


class DashboardArgs(_Args):
    port: int = Field(ge=1, le=65535, description="a TCP port from 1 to 65535")
    on_ready: Callable[..., Any] | None = Field(None, description=CALLBACK)


class ConfigTextArgs(_Args):
    config: dict[str, Any] = Field(description="a config as Study.best_config() or pareto_front() returns it (dict)")
    fmt: Literal["yaml", "json"] = Field("yaml", description="'yaml' or 'json'")


class ListEntriesArgs(_Args):
    kinds: list[Literal["methods", "models", "datasets"]] = Field(
        description="a list of 'methods', 'models', 'datasets'"
    )


class SlurmOptionsArgs(_Args):
    given: dict[str, Any] = Field(description="SlurmOptions' fields (dict)")
    flags: bool = Field(False, description=FLAG)


def check_args(model: type[_Args], call: str, **args: Any) -> _Args:
    """`args` validated by `model`; the first bad one raises ArgumentError naming `call`, the
    argument and what it allows (its field's description)."""
    try:
        return model(**args)
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "?"
        field = model.model_fields.get(name)
        allowed = field.description if field is not None and field.description else "see help(autofl)"
        shown = repr(args.get(name))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ArgumentError(f"{call}: {name}={shown} is not allowed; allowed: {allowed}") from None

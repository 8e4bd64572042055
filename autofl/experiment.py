"""Building an experiment: validate the config, then let its method check and complete its own part.

`autofl.config` holds the pydantic models and knows no method; this module joins the two, so the
import graph stays config <- methods <- experiment (no circle).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autofl.config import Experiment, apply_overrides, read_yaml
from autofl.errors import ConfigError, format_validation_error
from autofl.methods.registry import all_methods


def build_experiment(raw: dict[str, Any]) -> Experiment:
    """The validated experiment, its method's parameters checked and defaults filled in; a bad
    key or value raises ConfigError with one line naming it and what is allowed."""
    try:
        exp = Experiment.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, Experiment)) from None
    methods = all_methods()
    method_cls = methods.get(exp.method.name)
    if method_cls is None:
        raise ConfigError(f"method.name: unknown method {exp.method.name!r}; allowed: {', '.join(sorted(methods))}")
    try:
        return method_cls.resolve_experiment(exp, methods)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def load_experiment(path: str | Path | None = None, overrides: list[str] | None = None) -> Experiment:
    raw = read_yaml(path) if path is not None else {}
    return build_experiment(apply_overrides(raw, overrides or []))

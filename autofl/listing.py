"""What `autofl list` shows: every registered method, model and dataset, where it comes from, and
its parameters with their defaults and ranges (read from the pydantic models)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

from autofl.registry import REGISTRIES


@dataclass(frozen=True)
class Listed:
    kind: str  # methods, models, datasets
    name: str
    source: str  # built-in, or the distribution that provided it
    facts: str  # a dataset's shape and sizes, a model's split, a method's summary
    params: list[str]  # "name: type = default, range  (description)"


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    return getattr(annotation, "__name__", str(annotation))


def _range(metadata: list[Any]) -> str:
    low = high = ""
    for m in metadata:
        if isinstance(m, Ge):
            low = f"[{m.ge:g}" if isinstance(m.ge, (int, float)) else f"[{m.ge}"
        elif isinstance(m, Gt):
            low = f"({m.gt:g}" if isinstance(m.gt, (int, float)) else f"({m.gt}"
        elif isinstance(m, Le):
            high = f"{m.le:g}]" if isinstance(m.le, (int, float)) else f"{m.le}]"
        elif isinstance(m, Lt):
            high = f"{m.lt:g})" if isinstance(m.lt, (int, float)) else f"{m.lt})"
    if not low and not high:
        return ""
    return f"{low or '(-inf'}, {high or 'inf)'}"


def describe_params(params: type[BaseModel]) -> list[str]:
    """One line per field of a params model: `name: type = default in [low, high]  description`."""
    lines = []
    for name, field in params.model_fields.items():
        default = field.get_default(call_default_factory=True)
        text = f"{name}: {_type_name(field.annotation)} = {default!r}"
        span = _range(list(field.metadata))
        if span:
            text += f" in {span}"
        if field.description:
            text += f"  ({field.description})"
        lines.append(text)
    return lines


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _method_facts(cls: Any) -> str:
    import sys

    return _first_paragraph(cls.__doc__) or _first_paragraph(getattr(sys.modules.get(cls.__module__), "__doc__", ""))


def _model_facts(spec: Any) -> str:
    sizes = f"head_layers 1..{spec.linear_layers}"
    if spec.min_side > 1:
        sizes += f", images >= {spec.min_side}px"
    return f"{spec.description}; {sizes}" if spec.description else sizes


def _dataset_facts(spec: Any) -> str:
    if spec.num_classes is None or spec.input_shape is None:
        facts = "classes and shape from the data"
    else:
        facts = f"{spec.num_classes} classes, input {'x'.join(str(d) for d in spec.input_shape)}"
    if spec.train_size is not None:
        facts += f", {spec.train_size} train / {spec.test_size} test"
    if spec.natural_clients is not None:
        facts += f", {spec.natural_clients} natural clients"
    if spec.uses_path:
        facts += ", reads data.path"
    return f"{spec.description}; {facts}" if spec.description else facts


def listing(kinds: list[str]) -> list[Listed]:
    """The entries of `kinds` (methods, models, datasets), sorted by name within each kind."""
    rows = []
    for kind in kinds:
        registry = REGISTRIES[kind]
        for entry in registry.entries():
            value = entry.value
            if kind == "methods":
                rows.append(Listed(kind, entry.name, entry.source, _method_facts(value), describe_params(value.Params)))
            elif kind == "models":
                rows.append(Listed(kind, entry.name, entry.source, _model_facts(value), describe_params(value.Params)))
            else:
                rows.append(Listed(kind, entry.name, entry.source, _dataset_facts(value), []))
    return rows

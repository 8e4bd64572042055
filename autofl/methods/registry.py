"""The method registry: `autofl.registry.METHODS` (built-ins from this package, plugins from the
`autofl.methods` entry-point group). Adding a built-in method means adding one file in this package
whose `Method` subclass is decorated with `@register`; nothing else changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofl.registry import METHODS

if TYPE_CHECKING:
    from autofl.methods.base import Method


def register(cls: type[Method]) -> type[Method]:
    """Register a `Method` subclass under its `name` (a class decorator). Raises ValueError when
    another method already has that name."""
    if not getattr(cls, "name", ""):
        raise TypeError(f"{cls.__qualname__} has no name")
    return METHODS.add(cls)


def method_names() -> list[str]:
    return METHODS.names()


def all_methods() -> dict[str, type[Method]]:
    return METHODS.as_dict()


def get_method_class(name: str) -> type[Method]:
    """The method `name`; an unknown name is a ConfigError listing the registered ones."""
    return METHODS.get(name)

"""One registry pattern for methods, models and datasets: built-ins and installed plugins alike.

A `Registry` maps a name to an entry (a `Method` subclass, a `ModelSpec`, a `DatasetSpec`) and
remembers where each came from: `built-in`, or the distribution (pip package) that provided it.
Built-ins are found by importing their declaring modules; plugins by the entry-point groups
`autofl.methods`, `autofl.models` and `autofl.datasets` (`importlib.metadata`):

    [project.entry-points."autofl.methods"]
    lg_fedavg = "my_pkg.lg_fedavg:LGFedAvg"

Every lookup loads the built-ins, then the plugins, once per process, so a Ray worker that builds
an experiment sees the same entries as the driver. A plugin that fails to import, or whose name
collides with an entry already registered, or exits at import (`sys.exit()`), is skipped with one
line naming its distribution and the cause (`plugin_problems()`; printed once on stderr); the built-ins keep working.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from autofl.errors import ConfigError

BUILT_IN = "built-in"
USER = "user code"  # registered at run time by a script or notebook (not an installed distribution)

T = TypeVar("T")


@dataclass
class Entry(Generic[T]):
    name: str
    value: T
    source: str  # BUILT_IN, USER, or the name of the distribution that provided it


class Registry(Generic[T]):
    """Named entries of one kind (`kind` is what error lines call them: method, model, dataset)."""

    def __init__(
        self, kind: str, field: str, group: str, builtin_modules: Callable[[], list[str]], name_of: Callable[[T], str]
    ):
        self.kind = kind
        self.field = field  # the config key that names an entry (method.name, model.arch, data.dataset)
        self.group = group  # the entry-point group of plugins
        self._builtin_modules = builtin_modules
        self._name_of = name_of
        self._entries: dict[str, Entry[T]] = {}
        self._builtins_loaded = False
        self._loading_builtins = False
        self.accepted: type | None = None  # set by the module that declares this kind (accept)

    def accept(self, kind: type) -> None:
        """Entries must be `kind` (methods: subclasses of it). The declaring module calls this, so
        the registry itself imports none of them (no import circle through config)."""
        self.accepted = kind

    # ----- filling ---------------------------------------------------------------------------
    def add(self, value: T, source: str | None = None) -> T:
        """Register `value` under its own name. `source` None: built-in when declared inside
        autofl, else user code. Raises ValueError when the name is taken by another entry."""
        name = self._name_of(value)
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} {value!r} has no name")
        if source is None:  # a class knows its module; a declaration object (a spec) passes its source
            module = getattr(value, "__module__", "") if isinstance(value, type) else ""
            source = BUILT_IN if module == "autofl" or module.startswith("autofl.") else USER
        old = self._entries.get(name)
        if old is not None and old.value is not value and not _same_declaration(old.value, value):
            raise ValueError(f"{self.kind} name {name!r} is already registered ({old.source})")
        if old is not None and old.source != BUILT_IN and source not in (BUILT_IN, USER):
            old.source = source  # a plugin module that used @register, now loaded through its entry point
        if old is None:
            self._entries[name] = Entry(name, value, source)
        else:
            old.value = value  # a module imported again (reload): its newest declaration
        return value

    def discard(self, name: str) -> None:
        """Forget the entry `name` unless it is built-in (a notebook re-declaring its own entry)."""
        entry = self._entries.get(name)
        if entry is not None and entry.source == BUILT_IN:
            raise ValueError(f"{self.kind} {name!r} is built-in and stays registered")
        self._entries.pop(name, None)

    def _load_builtins(self) -> None:
        if self._builtins_loaded or self._loading_builtins:
            return
        self._loading_builtins = True
        try:
            for module in self._builtin_modules():
                importlib.import_module(module)
        finally:
            self._loading_builtins = False
        self._builtins_loaded = True

    def _ready(self) -> None:
        self._load_builtins()
        load_plugins()

    # ----- reading ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        self._ready()
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        self._ready()
        return [self._entries[n] for n in sorted(self._entries)]

    def as_dict(self) -> dict[str, T]:
        self._ready()
        return {n: e.value for n, e in sorted(self._entries.items())}

    def __contains__(self, name: object) -> bool:
        self._ready()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def unknown(self, name: object) -> str:
        """The one line for a name nobody registered."""
        return f"unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}"

    def get(self, name: str) -> T:
        """The entry `name`; an unknown name is a ConfigError naming the field and what is registered."""
        self._ready()
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(f"{self.field}: {self.unknown(name)}")
        return entry.value

    def source(self, name: str) -> str:
        self._ready()
        return self._entries[name].source


def _same_declaration(old: Any, new: Any) -> bool:
    """Whether `new` is `old` declared again (its module re-imported), not a second declaration."""
    return (getattr(old, "__module__", None), getattr(old, "__qualname__", None)) == (
        getattr(new, "__module__", None),
        getattr(new, "__qualname__", None),
    ) and isinstance(old, type)


def _method_modules() -> list[str]:
    import autofl.methods as package  # lazy: the engine imports no method (tests/test_server_hooks.py)

    skip = {"base", "registry"}
    return [
        f"autofl.methods.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if m.name not in skip and not m.name.startswith("_")
    ]


METHODS: Registry[Any] = Registry(
    "method", "method.name", "autofl.methods", _method_modules, lambda cls: getattr(cls, "name", "")
)
MODELS: Registry[Any] = Registry(
    "model", "model.arch", "autofl.models", lambda: ["autofl.models.archs"], lambda spec: getattr(spec, "name", "")
)
DATASETS: Registry[Any] = Registry(
    "dataset",
    "data.dataset",
    "autofl.datasets",
    lambda: ["autofl.data.catalog"],
    lambda spec: getattr(spec, "name", ""),
)
REGISTRIES: dict[str, Registry[Any]] = {"methods": METHODS, "models": MODELS, "datasets": DATASETS}

# ----- plugins -------------------------------------------------------------------------------
_plugins_loaded = False
_problems: list[str] = []


def plugin_problems() -> list[str]:
    """One line per plugin entry that was skipped (failed to import, or a name collision)."""
    load_plugins()
    return list(_problems)


def _check_kind(registry: Registry[Any], value: Any) -> None:
    """A plugin's entry must be of its group's kind (a Method subclass, a ModelSpec, a DatasetSpec),
    as the module declaring that kind told the registry (`Registry.accept`)."""
    kind = registry.accepted
    if kind is None:
        return
    if registry is METHODS:
        ok, want = isinstance(value, type) and issubclass(value, kind), f"a subclass of autofl {kind.__name__}"
    else:
        ok, want = isinstance(value, kind), f"an autofl {kind.__name__}"
    if not ok:
        raise TypeError(f"is {type(value).__name__ if not isinstance(value, type) else value.__qualname__}, not {want}")


def load_plugins() -> None:
    """Register every installed plugin entry once per process (idempotent; cheap after the first
    call). Call it in any process that builds experiments; registry lookups call it too."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for registry in REGISTRIES.values():
        registry._load_builtins()
    for registry in REGISTRIES.values():
        for ep in entry_points(group=registry.group):
            dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
            where = f"plugin {ep.name!r} ({registry.group}) from distribution {dist}"
            try:
                value = ep.load()
                _check_kind(registry, value)
                declared = registry._name_of(value)
                if declared != ep.name:
                    raise ValueError(
                        f"the entry point is named {ep.name!r} but the {registry.kind} is named {declared!r}"
                    )
                registry.add(value, source=dist)
            except KeyboardInterrupt:  # the user's Ctrl-C while a plugin imports stops the command
                raise
            except BaseException as err:  # noqa: BLE001 - any failure of a plugin skips that plugin only,
                # SystemExit included: a plugin module calling sys.exit() at import must not end the command
                detail = (
                    f"the plugin's module exited at import (code {err.code})"
                    if isinstance(err, SystemExit)
                    else str(err)
                )
                line = f"{where} skipped: {type(err).__name__}: {' '.join(detail.split())[:300]}"
                _problems.append(line)
                print(f"autofl: {line}", file=sys.stderr)

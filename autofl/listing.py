"""What `autofl list` shows: every registered method, model and dataset, where it comes from, and
its parameters with their defaults and ranges (read from the pydantic models).

Reading them imports every method's module, and with it torch (4-6 s on a 2-core machine), so
`cached_listing` keeps the rows in `$XDG_CACHE_HOME/autofl` (default `~/.cache/autofl`) under a
fingerprint of what they are read from: autofl's version and source files, the Python version, and
every installed plugin entry point with its distribution's version and its package's source files
(stat'ed, not imported). A listing that skipped a plugin is not kept, so its one-line warning shows
on every run until it is fixed.

Where no plugin is installed, the first call after an install reads no module either: the built-ins'
rows ship with autofl (`builtin_listing.json`, written by `scripts/write_builtin_listing.py`) under a
hash of the sources they are read from, and are used while that hash matches the files here (an edited
method or model is read anew); a test holds the shipped rows equal to the live ones."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pydantic
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

import autofl
from autofl.registry import BUILT_IN, REGISTRIES, plugin_problems


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


CACHE_FORMAT = 1  # bump when Listed or the text of a row changes


def cache_folder() -> Path | None:
    """Where the rows are kept; None where there is no cache folder (no XDG_CACHE_HOME and no home)."""
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "autofl"
    try:
        return Path.home() / ".cache" / "autofl"
    except (RuntimeError, KeyError, OSError):  # no HOME and no passwd entry (some batch containers)
        return None


def _stamps(root: Path) -> list[tuple[str, int, int]]:
    """(path, mtime, size) of every .py file under `root` (a package folder) or of `root` (a module)."""
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    out = []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size))
    return out


def _source_of(module: str) -> list[tuple[str, int, int]] | str:
    """The stamps of a plugin's top-level package, located without importing it."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "missing"
    if spec.submodule_search_locations:
        return [s for location in spec.submodule_search_locations for s in _stamps(Path(location))]
    return _stamps(Path(spec.origin)) if spec.origin else "no file"


def fingerprint() -> str:
    """What the rows depend on, hashed (see the module's docstring)."""
    # pydantic shapes the rows' text (types, defaults); annotated_types comes with it
    parts: list[Any] = [CACHE_FORMAT, sys.version, autofl.__version__, pydantic.VERSION]
    parts.append(_stamps(Path(autofl.__file__).parent))
    for registry in REGISTRIES.values():
        for ep in sorted(entry_points(group=registry.group), key=lambda e: (e.name, e.value)):
            dist = (ep.dist.name, ep.dist.version) if ep.dist is not None else None
            parts.append((registry.group, ep.name, ep.value, dist, _source_of(ep.module)))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


BUILTIN_ROWS = Path(__file__).with_name("builtin_listing.json")  # the file the built-ins' rows ship in
# what the built-ins' rows are read from: their declaring packages, and the modules that turn a
# declaration into a row (a change elsewhere that alters a row fails tests/test_startup_imports.py)
BUILTIN_SOURCES = ("methods", "models", "data", "config.py", "listing.py", "registry.py")


def builtin_sources_hash() -> str:
    """A hash of the contents of BUILTIN_SOURCES' .py files."""
    root = Path(__file__).parent
    digest = hashlib.sha256(f"{CACHE_FORMAT}".encode())
    for name in BUILTIN_SOURCES:
        path = root / name
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(f"\0{source.relative_to(root).as_posix()}\0".encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:24]


def toolchain() -> dict[str, str]:
    """The versions that shape the rows' text besides the sources (type names, defaults)."""
    return {"python": "{}.{}".format(*sys.version_info[:2]), "pydantic": pydantic.VERSION}


def builtin_rows() -> list[Listed]:
    """The built-ins' rows, read from their classes (imports every built-in entry, and torch)."""
    return [row for row in listing(list(REGISTRIES)) if row.source == BUILT_IN]


def shipped_builtin_rows() -> list[Listed] | None:
    """The built-ins' rows as shipped in BUILTIN_ROWS, or None when they were not read from the
    sources here (an edited built-in, another Python or pydantic) or cannot be read."""
    try:
        shipped = json.loads(BUILTIN_ROWS.read_text())
        if shipped["sources"] != builtin_sources_hash() or shipped["toolchain"] != toolchain():
            return None
        return [Listed(**row) for row in shipped["rows"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_builtin_rows() -> Path:
    """Write BUILTIN_ROWS from the built-ins as they are now (scripts/write_builtin_listing.py)."""
    rows = [dataclasses.asdict(row) for row in builtin_rows()]
    shipped = {"sources": builtin_sources_hash(), "toolchain": toolchain(), "rows": rows}
    BUILTIN_ROWS.write_text(json.dumps(shipped, indent=1) + "\n")
    return BUILTIN_ROWS


def plugins_installed() -> bool:
    """Whether any distribution declares an entry in autofl's plugin groups (read from the installed
    metadata; no plugin is imported)."""
    return any(entry_points(group=registry.group) for registry in REGISTRIES.values())


def _read_rows(plugins: bool) -> list[Listed]:
    """Every row: the shipped built-in rows when no plugin is installed (`plugins`: whether one is)
    and they match the sources, else read from the registries (importing every entry)."""
    if not plugins:
        shipped = shipped_builtin_rows()
        if shipped is not None:
            return shipped
    return listing(list(REGISTRIES))


def cached_listing(kinds: list[str]) -> list[Listed]:
    """`listing(kinds)`, from the cache when its fingerprint matches; else read (from the shipped
    built-in rows, or importing every entry) and kept for the next call, unless a plugin was skipped
    or the cache cannot be written."""
    path = _cache_file()
    if path is None:
        rows = _read_rows(plugins_installed())
    else:
        try:
            rows = [Listed(**row) for row in json.loads(path.read_text())]
        except (OSError, ValueError, TypeError):
            plugins = plugins_installed()
            rows = _read_rows(plugins)
            if not plugins or not plugin_problems():
                _keep(path, rows)
    return [row for kind in kinds for row in rows if row.kind == kind]


def keep_listing() -> None:
    """Keep the listing's rows unless they are kept already (a search's driver, which has imported
    the registries' entries, leaves them for the first `autofl list` after an install)."""
    path = _cache_file()
    if path is None or path.exists() or plugin_problems():  # kept already: no plugin is loaded for it
        return
    # a cache: a plugin whose rows cannot be read must not fail the train or search that keeps it
    # (`autofl list` reads it then and says what is wrong)
    with contextlib.suppress(Exception):
        _keep(path, listing(list(REGISTRIES)))


def _cache_file() -> Path | None:
    """The file the rows of this install (its fingerprint) are kept in, or None without a cache folder."""
    folder = cache_folder()
    return folder / f"listing-{fingerprint()}.json" if folder is not None else None


def _keep(path: Path, rows: list[Listed]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("listing-*.json"):
            old.unlink(missing_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([dataclasses.asdict(row) for row in rows]))
        os.replace(tmp, path)
    except OSError:  # a read-only home: the listing is read each time
        pass

"""autofl's imports sit at the top of their module (issue 38): a reader sees what a module depends on
in one place, and a misspelled or moved name fails when the module is imported, not when one
function first runs in a Ray worker. An import stays inside a function only where that is on
purpose, and then says so:

- a heavy library (torch, Ray, Optuna, SQLAlchemy, matplotlib, ...) that the module's other uses do
  not need: read-only commands (`autofl --help`, `studies`, `status`, `list`, `best-config export`)
  start without them (tests/test_startup_imports.py);
- an optional dependency (optuna-dashboard, psycopg) whose absence must not break the module;
- anything else kept lazy carries a `# lazy: <why>` comment on its line: an autofl module that pulls
  torch, Ray or Optuna, one that would close an import circle, or one whose import at the top would
  break a rule another test guards (the engine imports no method).

The source is read with `ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import autofl

PACKAGE = Path(autofl.__file__).parent
ROOT = PACKAGE.parent

# libraries whose import a read-only command must not pay for unless it needs them
HEAVY = ("torch", "torchvision", "ray", "optuna", "sqlalchemy", "psycopg", "matplotlib", "plotly", "sklearn",
         "scipy", "numpy", "pandas", "pyarrow", "optuna_dashboard")
# extras a module must import without (pyproject.toml: optional-dependencies, or a driver a URL names)
OPTIONAL = ("optuna_dashboard", "psycopg")
LAZY_MARK = "# lazy:"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def function_level_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The imports inside a function or lambda body (at any depth), leaving out `if TYPE_CHECKING:`
    blocks, which never run."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(stmt, in_function)
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def imported_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["." * node.level + (node.module or "")]


def _names(module: str, libraries: tuple[str, ...]) -> bool:
    return any(module == lib or module.startswith(lib + ".") for lib in libraries)


def unexplained(source: str) -> list[str]:
    """`line: text` of each function-level import in `source` that is neither of a heavy library,
    nor of an optional one, nor marked `# lazy:`."""
    lines = source.splitlines()
    found = []
    for node in function_level_imports(ast.parse(source)):
        text = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
        if any(LAZY_MARK in line for line in text):
            continue
        if all(_names(m, HEAVY) or _names(m, OPTIONAL) for m in imported_modules(node)):
            continue
        found.append(f"{node.lineno}: {text[0].strip()}")
    return found


def sources() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def test_the_reader_tells_a_kept_import_from_one_to_move():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "if TYPE_CHECKING:\n"
        "    from autofl.api import Study\n"
        "def f():\n"
        "    import torch\n"
        "    import optuna.visualization.matplotlib as ovm\n"
        "    from psycopg import connect\n"
        "    from autofl.training import train  # lazy: pulls torch\n"
        "    from autofl.errors import (  # lazy: just to show a wrapped import\n"
        "        ConfigError,\n"
        "    )\n"
        "    import json\n"
        "    class C:\n"
        "        def g(self):\n"
        "            if TYPE_CHECKING:\n"
        "                from autofl.views import x\n"
        "            from autofl.files import write_atomic\n"
        "    return lambda: __import__('x')\n"
        "def h():\n"
        "    import torch, re\n"
        "    from .text import clean\n"
        "    import torchvisionary\n"
    )
    assert unexplained(source) == [
        "13: import json",
        "18: from autofl.files import write_atomic",
        "21: import torch, re",
        "22: from .text import clean",
        "23: import torchvisionary",
    ]


def test_function_level_imports_are_heavy_optional_or_say_why():
    """Issue 38: an import inside a function is a heavy or optional library, or says `# lazy: why`;
    every other one belongs at the top of its module."""
    found = {}
    for path, text in sources().items():
        if hits := unexplained(text):
            found[path] = hits
    assert not found, "move these to the module's top, or mark them `# lazy: <why>`:\n" + "\n".join(
        f"{path}:{hit}" for path, hits in found.items() for hit in hits)


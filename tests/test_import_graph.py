"""autofl's modules import each other one way: no circle in the import graph, counting imports at
module level and inside functions (a function-level import hides a circle from Python, not from
a reader). The graph is read from the source with `ast`, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import autofl

PACKAGE = Path(autofl.__file__).parent

def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(module: str, path: Path, known: set[str], typing_too: bool = False) -> set[str]:
    """The autofl modules `module` imports anywhere in its file (with `typing_too`, also those
    imported for type checking only)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only and not typing_too:  # `if TYPE_CHECKING:` imports never run
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `from autofl.x import name`: the module autofl.x
                target = target.rpartition(".")[0]
            if target and target != module and target != "autofl":
                found.add(target)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    names = module_names()
    return {module: imports_of(module, path, set(names), typing_too) for module, path in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reader_finds_a_circle_and_resolves_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    graph = import_graph()
    assert "autofl.tuning.store.ledger" in graph["autofl.tuning.tune.searcher"]  # module level
    assert "autofl.tuning.tune.searcher" in graph["autofl.tuning.tune.experiment"]  # inside a function


def test_autofl_has_no_import_circle():
    assert cycles(import_graph()) == []


def test_every_autofl_import_names_a_module_that_exists():
    """A function-level import of a missing module fails only when that function runs (in a
    Ray worker, or a re-evaluation): caught here, from the source."""
    names = module_names()
    missing = []
    for module, path in names.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("autofl"):
                if node.module not in names:
                    missing.append(f"{module}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                missing += [f"{module}: import {a.name}" for a in node.names
                            if a.name.startswith("autofl") and a.name not in names]
    assert not missing, missing


def test_the_engine_a_method_author_reads_imports_no_acceleration():
    """autofl.engine (plan, server, simulation, the reference executor, metrics, state, the executor
    seam) reaches autofl.accel through one edge: the simulation asks autofl.accel.choice for its
    executor. Methods and their loss terms never import autofl.accel; autofl.accel builds on the
    engine's seam, never on a method."""
    graph = import_graph()
    into_accel = sorted((m, t) for m, targets in graph.items() if m.startswith("autofl.engine")
                        for t in targets if t.startswith("autofl.accel"))
    assert into_accel == [("autofl.engine.simulation", "autofl.accel.choice")]
    for module, targets in graph.items():
        if module.startswith(("autofl.methods", "autofl.losses")):
            assert not any(t.startswith("autofl.accel") for t in targets), module
        if module.startswith("autofl.accel"):
            assert not any(t.startswith("autofl.methods") for t in targets), module


def test_the_engine_has_no_import_circle_even_for_type_checking():
    graph = import_graph(typing_too=True)
    inside = {m: {t for t in targets if t.startswith(("autofl.engine", "autofl.accel"))}
              for m, targets in graph.items() if m.startswith(("autofl.engine", "autofl.accel"))}
    assert cycles(inside) == []


# what the command line may import: the Python API, and the helpers that print and write what it returns
CLI_TALKS_TO = {"autofl.api", "autofl.errors", "autofl.text", "autofl.units", "autofl.views", "autofl.files",
                "autofl.limits"}


def test_the_cli_talks_only_to_the_api_and_presentation_helpers():
    """Issue 38: the CLI reached into storage, study, preflight, engine and registry modules; everything
    it does now goes through `autofl.api` (so a Python caller can do the same)."""
    names = module_names()
    assert imports_of("autofl.cli", names["autofl.cli"], set(names), typing_too=True) <= CLI_TALKS_TO

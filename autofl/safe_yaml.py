"""Bounded YAML: `yaml.safe_load` with a size limit and no alias bombs.

Config and space files are small (the shipped ones are under 4 KB); a file of megabytes is a
mistake or an attack, and PyYAML's aliases let a few hundred bytes stand for billions of nodes
(`a: &a [x, x], b: &b [*a, *a], ...`): PyYAML builds them shared, but validating, copying or
dumping the config expands them. Loading refuses a document whose aliases add more than
`MAX_ALIAS_NODES` nodes to it when expanded, and a self-referencing one (`&a [*a]`). A document
without aliases is as large as its text (at most `MAX_BYTES`), so a plain list of a megabyte is
accepted; a large document is parsed by libyaml (PyYAML's C loader, where installed) rather than
PyYAML's Python parser, which took over a minute for a 1 MB list on a loaded 2-core machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # 1 MiB per config or space file
MAX_ALIAS_NODES = 100_000  # nodes that expanding the aliases may add to a document
MAX_NODES = MAX_ALIAS_NODES  # the name earlier versions exported

# libyaml's safe loader where PyYAML was built with it: same resolver and constructor, C parser
_SafeBase: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlTooLarge(ValueError):
    """The document is larger than allowed (bytes, or nodes after alias expansion)."""


class BoundedSafeLoader(_SafeBase):
    """A safe loader that refuses documents whose aliases expand by more than MAX_ALIAS_NODES nodes
    or into a cycle (checked on the composed node graph, before any Python object is built)."""

    def construct_document(self, node: yaml.Node) -> Any:
        check_aliases(node)
        return super().construct_document(node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def node_graph(root: yaml.Node) -> tuple[int, bool]:
    """(distinct nodes in `root`'s graph, whether any node is reached twice, i.e. an alias): the
    distinct nodes are what the document's text holds; iterative, so any depth."""
    seen: set[int] = set()
    edges = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        children = _children(node)
        edges += len(children)
        stack.extend(children)
    return len(seen), edges != len(seen) - 1  # a tree has one edge fewer than nodes


def expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes in `root` with every alias expanded (memoized per node; raises YamlTooLarge past
    `limit` or on a cycle)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise YamlTooLarge("an alias refers to the node that holds it (a self-referencing structure)")
        on_path.add(key)
        total = 1
        for child in _children(node):
            total += size(child)
            if total > limit:
                raise YamlTooLarge(f"its aliases expand it by more than {MAX_ALIAS_NODES} nodes (an alias bomb?)")
        on_path.discard(key)
        sizes[key] = total
        return total

    return size(root)


def check_aliases(root: yaml.Node) -> int:
    """The expanded size of `root`; YamlTooLarge when aliases add more than MAX_ALIAS_NODES nodes
    to the distinct ones (a plain document, however long, adds none) or form a cycle."""
    distinct, shared = node_graph(root)
    if not shared:  # no alias: the document is its text, already bounded by MAX_BYTES
        return distinct
    return expanded_size(root, distinct + MAX_ALIAS_NODES)


def load_text(text: str) -> Any:
    """`yaml.safe_load(text)`, bounded (raises YamlTooLarge or yaml.YAMLError)."""
    if len(text) > MAX_BYTES:
        raise YamlTooLarge(f"{len(text)} characters; allowed: at most {MAX_BYTES}")
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # nesting deeper than Python's stack
        raise YamlTooLarge("nested too deeply") from None
    except yaml.YAMLError as err:
        if "nesting depth" in str(getattr(err, "problem", "")):  # libyaml's own depth limit
            raise YamlTooLarge("nested too deeply") from None
        raise


def read_text_bounded(path: Path) -> str:
    """The file's text, refusing files over MAX_BYTES before reading them (raises YamlTooLarge,
    OSError, UnicodeDecodeError)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlTooLarge(f"larger than {MAX_BYTES // 1024} KiB; config and space files are small")
    return data.decode("utf-8")

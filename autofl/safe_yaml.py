"""Bounded YAML: `yaml.safe_load` with a size limit and no alias bombs.

Config and space files are small (the shipped ones are under 4 KB); a file of megabytes is a
mistake or an attack, and PyYAML's aliases let a few hundred bytes stand for billions of nodes
(`a: &a [x, x], b: &b [*a, *a], ...`): PyYAML builds them shared, but validating, copying or
dumping the config expands them. Loading refuses a document whose expanded node count exceeds
`MAX_NODES` and a self-referencing one (`&a [*a]`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # 1 MiB per config or space file
MAX_NODES = 100_000  # nodes after expanding every alias


class YamlTooLarge(ValueError):
    """The document is larger than allowed (bytes, or nodes after alias expansion)."""


class BoundedSafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses documents whose aliases expand beyond MAX_NODES or into a cycle."""

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            expanded_size(node)
        return node


def expanded_size(root: yaml.Node, limit: int = MAX_NODES) -> int:
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
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                raise YamlTooLarge(f"its aliases expand to more than {limit} nodes (an alias bomb?)")
        on_path.discard(key)
        sizes[key] = total
        return total

    return size(root)


def load_text(text: str) -> Any:
    """`yaml.safe_load(text)`, bounded (raises YamlTooLarge or yaml.YAMLError)."""
    if len(text) > MAX_BYTES:
        raise YamlTooLarge(f"{len(text)} characters; allowed: at most {MAX_BYTES}")
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # nesting deeper than Python's stack
        raise YamlTooLarge("nested too deeply") from None


def read_text_bounded(path: Path) -> str:
    """The file's text, refusing files over MAX_BYTES before reading them (raises YamlTooLarge,
    OSError, UnicodeDecodeError)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlTooLarge(f"larger than {MAX_BYTES // 1024} KiB; config and space files are small")
    return data.decode("utf-8")

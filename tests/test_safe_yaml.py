"""Bounded YAML (autofl/safe_yaml.py): alias expansion is limited, a plain document is limited only
by its size in bytes."""

from __future__ import annotations

import pytest

from autofl.config import read_yaml
from autofl.errors import ConfigError
from autofl.safe_yaml import YamlTooLarge, load_text

MAX_ALIAS_NODES = 100_000  # autofl.safe_yaml.MAX_ALIAS_NODES


def test_a_large_plain_list_is_accepted(tmp_path):
    """Issue 42: a plain list of more than 100,000 items was refused as "an alias bomb?"."""
    items = MAX_ALIAS_NODES + 10_000
    path = tmp_path / "config.yaml"
    path.write_text("metadata:\n  xs: [" + ", ".join(["1"] * items) + "]\n")
    assert read_yaml(path)["metadata"]["xs"] == [1] * items


def test_aliases_may_add_up_to_the_limit_and_no_more():
    anchor = "[" + ", ".join(["1"] * 999) + "]"  # 1000 nodes
    fits = load_text(f"a: &x {anchor}\nb: [{', '.join(['*x'] * 90)}]\n")
    assert fits["b"] == [[1] * 999] * 90  # 90,000 nodes added by aliases
    with pytest.raises(YamlTooLarge, match="alias bomb"):
        load_text(f"a: &x {anchor}\nb: [{', '.join(['*x'] * 110)}]\n")


def test_a_bomb_inside_a_large_plain_document_is_still_refused(tmp_path):
    plain = ", ".join(["1"] * (MAX_ALIAS_NODES + 10_000))
    bomb = "".join(f"  {a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
                   for p, a in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh"))
    path = tmp_path / "config.yaml"
    path.write_text(f"metadata:\n  xs: [{plain}]\n{bomb}")
    with pytest.raises(ConfigError, match="refused: its aliases expand it by more than 100000 nodes"):
        read_yaml(path)
    with pytest.raises(YamlTooLarge, match="self-referencing"):
        load_text("a: &m {loop: [1, *m]}\n")

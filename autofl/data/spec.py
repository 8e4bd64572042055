"""A dataset declaration: its facts, said once, and how to load it.

A plugin declares one `DatasetSpec`:

    def load_toy(cfg: DataConfig) -> RawDataset:
        ...  # tensors: x float (N, C, H, W), y int64 (N,), and a test pair

    TOY = DatasetSpec("toy", load_toy, num_classes=10, input_shape=(1, 28, 28), train_size=60000, test_size=10000)

`num_classes` and `input_shape` None mean the facts are known only from the data (e.g. a file
named by `data.path`): validating a config then loads it once (cached for the run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autofl.data.datasets import load_raw_dataset
from autofl.data.raw import RawDataset
from autofl.registry import DATASETS

if TYPE_CHECKING:
    from autofl.config import DataConfig


@dataclass(frozen=True)
class DatasetFacts:
    num_classes: int
    input_shape: tuple[int, ...]  # (C, H, W)
    natural_clients: int | None  # clients of the natural partition; None: the dataset has none
    natural_test: bool | None = None  # whether the test samples carry client ids too (None: not known)


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset. `load(cfg)` returns its `RawDataset` (cfg: the experiment's `data` section,
    for `root`, `download`, `path`); `uses_path`: whether it reads `data.path`; `natural_clients`:
    how many clients its natural partition has (None: it has none)."""

    name: str
    load: Callable[[DataConfig], RawDataset]
    num_classes: int | None = None
    input_shape: tuple[int, ...] | None = None
    train_size: int | None = None
    test_size: int | None = None
    natural_clients: int | None = None
    uses_path: bool = False
    description: str = ""

    def facts(self, cfg: DataConfig) -> DatasetFacts:
        """The dataset's facts: declared, or read from the data when not declared."""
        if self.num_classes is not None and self.input_shape is not None:
            return DatasetFacts(self.num_classes, tuple(self.input_shape), self.natural_clients)

        raw = load_raw_dataset(cfg)
        return DatasetFacts(raw.num_classes, raw.input_shape, raw.num_natural_clients, raw.test_client is not None)


DATASETS.accept(DatasetSpec)  # plugin entries in autofl.datasets must be DatasetSpecs

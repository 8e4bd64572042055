"""The in-memory form every dataset loads into (a leaf module: loaders, specs and the engine share it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RawDataset:
    """An official train / test pair as in-memory tensors: x float32 (N, C, H, W), y int64 (N,).
    `train_client` / `test_client` (int64, one client id per sample, ids 0..K-1) are the natural
    partition of datasets that carry one (`data.partition.kind: natural`)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    train_client: torch.Tensor | None = None
    test_client: torch.Tensor | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    @property
    def num_natural_clients(self) -> int | None:
        return None if self.train_client is None else int(self.train_client.max()) + 1 if len(self.train_client) else 0

"""Every model is encoder -> projector -> head (spec §1 'Model layout').

An arch (a registered `autofl.models.spec.ModelSpec`) is a `body` (convolutions, flatten) followed
by a stack of Linear layers; the last `head_layers` Linear layers of the stack form the head, the
rest join the encoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from autofl.config import ModelConfig
from autofl.models.spec import LinearSpec
from autofl.registry import MODELS


class SplitModel(nn.Module):
    """encoder -> projector (nn.Identity when depth 0) -> head; methods may attach more modules."""

    def __init__(
        self, encoder: nn.Module, projector: nn.Module, head: nn.Module, feature_dim: int, embed_dim: int | None = None
    ):
        super().__init__()
        self.encoder = encoder
        self.projector = projector
        self.head = head
        self.feature_dim = feature_dim  # the encoder's output
        self.embed_dim = embed_dim or feature_dim  # the projector's output, the head's input

    if TYPE_CHECKING:  # for type checkers: the modules a method attaches (model.personal, model.global_head ...)

        def __getattr__(self, name: str) -> nn.Module: ...

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.projector(self.encoder(x)))


def arch_layers(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> tuple[nn.Module, list[LinearSpec]]:
    """The body and Linear stack of `cfg.arch` (a registered `ModelSpec`) with its own params."""
    spec = MODELS.get(cfg.arch)
    return spec.layers(input_shape, num_classes, spec.Params(**cfg.params()))


def _stack(specs: list[LinearSpec]) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for spec in specs:
        layers.append(nn.Linear(spec.in_features, spec.out_features))
        if spec.relu_after:
            layers.append(nn.ReLU())
    return layers


def build_projector(depth: int, dim: int, hidden: int, out: int | None = None) -> nn.Module:
    """L=1: Linear(d,o) BN; L=2: Linear(d,h) ReLU BN Linear(h,o) BN; each extra layer adds Linear(h,h) ReLU BN.
    The output width o is d unless a method fixes it (FedSiam-DA: 256)."""
    out = out or dim
    if depth == 0:
        return nn.Identity()
    if depth == 1:
        return nn.Sequential(nn.Linear(dim, out), nn.BatchNorm1d(out))
    layers: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU(), nn.BatchNorm1d(hidden)]
    for _ in range(depth - 2):
        layers += [nn.Linear(hidden, hidden), nn.ReLU(), nn.BatchNorm1d(hidden)]
    layers += [nn.Linear(hidden, out), nn.BatchNorm1d(out)]
    return nn.Sequential(*layers)


def build_head(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A fresh head of the arch's split (used by methods that keep a second head)."""
    _, specs = arch_layers(cfg, input_shape, num_classes)
    return nn.Sequential(*_stack(specs[-cfg.head_layers :]))


def build_model(
    cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, projector_out: int | None = None
) -> SplitModel:
    """`projector_out`: the projector's output width when a method fixes it (else the encoder's)."""
    body, specs = arch_layers(cfg, input_shape, num_classes)
    h = cfg.head_layers
    if not 1 <= h <= len(specs):
        raise ValueError(f"model.head_layers: {h} is outside what arch {cfg.arch} allows; allowed 1..{len(specs)}")
    encoder = nn.Sequential(body, *_stack(specs[:-h]))
    feature_dim = specs[-h].in_features
    depth = cfg.projector_depth or 0
    embed_dim = projector_out if depth and projector_out else feature_dim
    first = specs[-h]  # the head's first layer reads the projector's output
    head = nn.Sequential(
        *_stack([LinearSpec(embed_dim, first.out_features, first.relu_after), *specs[len(specs) - h + 1 :]])
    )
    projector = build_projector(depth, feature_dim, cfg.projector_dim or 256, embed_dim)
    return SplitModel(encoder, projector, head, feature_dim, embed_dim)

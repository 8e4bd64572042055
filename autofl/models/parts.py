"""Every model is encoder -> projector -> head (spec §1 'Model layout').

An arch is a `body` (convolutions, flatten) followed by a stack of Linear layers; the last
`head_layers` Linear layers of the stack form the head, the rest join the encoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from autofl.config import ARCH_LINEAR_LAYERS, ModelConfig


@dataclass(frozen=True)
class LinearSpec:
    in_features: int
    out_features: int
    relu_after: bool


class SplitModel(nn.Module):
    """encoder -> projector (nn.Identity when depth 0) -> head; methods may attach more modules."""

    def __init__(self, encoder: nn.Module, projector: nn.Module, head: nn.Module, feature_dim: int,
                 embed_dim: int | None = None):
        super().__init__()
        self.encoder = encoder
        self.projector = projector
        self.head = head
        self.feature_dim = feature_dim  # the encoder's output
        self.embed_dim = embed_dim or feature_dim  # the projector's output, the head's input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.projector(self.encoder(x)))


def _flat_size(body: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(body(torch.zeros(1, *input_shape)).shape[1])


def _conv_body(in_channels: int, widths: tuple[int, int]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, widths[0], 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(widths[0], widths[1], 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )


def _resnet18_body(in_channels: int) -> nn.Module:
    from torchvision.models import resnet18

    net = resnet18(weights=None)
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)  # CIFAR stem
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


def build_body_and_stack(arch: str, input_shape: tuple[int, ...], num_classes: int) -> tuple[nn.Module, list[LinearSpec]]:
    channels = input_shape[0]
    if arch == "mlp":
        return nn.Flatten(), [LinearSpec(math.prod(input_shape), 100, True), LinearSpec(100, num_classes, False)]
    if arch == "cnn":
        body = _conv_body(channels, (32, 64))
        flat = _flat_size(body, input_shape)
        return body, [LinearSpec(flat, 512, True), LinearSpec(512, num_classes, False)]
    if arch == "moon_cnn":
        body = _conv_body(channels, (6, 16))
        flat = _flat_size(body, input_shape)
        dims = [(flat, 120, True), (120, 84, True), (84, 84, True), (84, 256, False), (256, num_classes, False)]
        return body, [LinearSpec(*d) for d in dims]
    if arch == "resnet18":
        return _resnet18_body(channels), [LinearSpec(512, num_classes, False)]
    raise ValueError(f"model.arch: unknown arch {arch!r}; allowed: {', '.join(ARCH_LINEAR_LAYERS)}")


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
    _, specs = build_body_and_stack(cfg.arch, input_shape, num_classes)
    return nn.Sequential(*_stack(specs[-cfg.head_layers :]))


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int,
                projector_out: int | None = None) -> SplitModel:
    """`projector_out`: the projector's output width when a method fixes it (else the encoder's)."""
    body, specs = build_body_and_stack(cfg.arch, input_shape, num_classes)
    h = cfg.head_layers
    if not 1 <= h <= len(specs):
        raise ValueError(f"model.head_layers: {h} is outside what arch {cfg.arch} allows; allowed 1..{len(specs)}")
    encoder = nn.Sequential(body, *_stack(specs[:-h]))
    feature_dim = specs[-h].in_features
    depth = cfg.projector_depth or 0
    embed_dim = projector_out if depth and projector_out else feature_dim
    first = specs[-h]  # the head's first layer reads the projector's output
    head = nn.Sequential(*_stack([LinearSpec(embed_dim, first.out_features, first.relu_after),
                                  *specs[len(specs) - h + 1 :]]))
    projector = build_projector(depth, feature_dim, cfg.projector_dim or 256, embed_dim)
    return SplitModel(encoder, projector, head, feature_dim, embed_dim)

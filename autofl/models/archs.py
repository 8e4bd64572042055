"""The built-in archs: mlp, cnn, moon_cnn, resnet18 (each one `ModelSpec`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from autofl.models.spec import LinearSpec, ModelParams, ModelSpec
from autofl.registry import BUILT_IN, MODELS


def flat_size(body: nn.Module, input_shape: tuple[int, ...]) -> int:
    """The width of `body`'s output for one input of `input_shape`."""
    with torch.no_grad():
        return int(body(torch.zeros(1, *input_shape)).shape[1])


def _conv_body(in_channels: int, widths: tuple[int, int]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, widths[0], 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(widths[0], widths[1], 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )


def _mlp(input_shape: tuple[int, ...], num_classes: int, params: ModelParams) -> tuple[nn.Module, list[LinearSpec]]:
    return nn.Flatten(), [LinearSpec(math.prod(input_shape), 100, True), LinearSpec(100, num_classes, False)]


def _cnn(input_shape: tuple[int, ...], num_classes: int, params: ModelParams) -> tuple[nn.Module, list[LinearSpec]]:
    body = _conv_body(input_shape[0], (32, 64))
    return body, [LinearSpec(flat_size(body, input_shape), 512, True), LinearSpec(512, num_classes, False)]


def _moon_cnn(
    input_shape: tuple[int, ...], num_classes: int, params: ModelParams
) -> tuple[nn.Module, list[LinearSpec]]:
    body = _conv_body(input_shape[0], (6, 16))
    flat = flat_size(body, input_shape)
    dims = [(flat, 120, True), (120, 84, True), (84, 84, True), (84, 256, False), (256, num_classes, False)]
    return body, [LinearSpec(*d) for d in dims]


def _resnet18(
    input_shape: tuple[int, ...], num_classes: int, params: ModelParams
) -> tuple[nn.Module, list[LinearSpec]]:
    from torchvision.models import resnet18

    net = resnet18(weights=None)
    net.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)  # CIFAR stem
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net, [LinearSpec(512, num_classes, False)]


# smallest sides: two unpadded 5x5 convs with 2x2 pooling need 14px; resnet18's stem 8px
for _spec in (
    ModelSpec("mlp", _mlp, linear_layers=2, linear_only=True, description="Flatten, Linear(d,100), ReLU, Linear"),
    ModelSpec("cnn", _cnn, linear_layers=2, min_side=14, description="2 conv(5x5, 32/64) + pool, Linear 512, Linear"),
    ModelSpec(
        "moon_cnn",
        _moon_cnn,
        linear_layers=5,
        min_side=14,
        description="MOON's CNN: 2 conv(5x5, 6/16) + pool, Linear 120, 84, 84, 256, Linear",
    ),
    ModelSpec(
        "resnet18",
        _resnet18,
        linear_layers=1,
        min_side=8,
        description="torchvision ResNet-18 with a CIFAR stem (3x3 conv, no max-pool), Linear",
    ),
):
    MODELS.add(_spec, BUILT_IN)

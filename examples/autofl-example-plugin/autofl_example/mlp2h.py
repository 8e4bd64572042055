"""mlp2h: Flatten, Linear(d, hidden), ReLU, Linear(hidden, hidden), ReLU, Linear(hidden, classes),
with the hidden width as the model's own (searchable) parameter `model.hidden`."""

import math

from pydantic import Field
from torch import nn

from autofl.models.spec import LinearSpec, ModelParams, ModelSpec


class MLP2HParams(ModelParams):
    hidden: int = Field(64, ge=4, le=4096, description="width of both hidden layers")


def layers(input_shape: tuple[int, ...], num_classes: int, params: MLP2HParams) -> tuple[nn.Module, list[LinearSpec]]:
    d, h = math.prod(input_shape), params.hidden
    return nn.Flatten(), [LinearSpec(d, h, True), LinearSpec(h, h, True), LinearSpec(h, num_classes, False)]


MLP2H = ModelSpec("mlp2h", layers, linear_layers=3, linear_only=True, Params=MLP2HParams,
                  description="MLP with two hidden layers of model.hidden units")

"""A model declaration: how an arch builds the layers that `build_model` splits into
encoder -> projector -> head, and the parameters of its own.

An arch is a `body` (convolutions, flatten: anything) followed by a stack of Linear layers; the
last `model.head_layers` Linear layers form the head, the rest join the encoder, and the
projector (when a method uses one) sits between them. A plugin declares one `ModelSpec`:

    class WideMLPParams(ModelParams):
        hidden: int = Field(200, ge=1, le=4096, description="hidden width")

    def wide_mlp(input_shape, num_classes, params):
        flat = math.prod(input_shape)
        return nn.Flatten(), [LinearSpec(flat, params.hidden, True), LinearSpec(params.hidden, num_classes, False)]

    WIDE_MLP = ModelSpec("wide_mlp", wide_mlp, linear_layers=2, linear_only=True, Params=WideMLPParams)

Its parameters are set beside the arch (`model: {arch: wide_mlp, hidden: 300}`), validated by
`Params` like a method's, and searchable as `model.hidden`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from autofl.config import Strict
from autofl.registry import MODELS


class ModelParams(Strict):
    """An arch's own parameters; unknown keys and non-finite numbers are errors."""


@dataclass(frozen=True)
class LinearSpec:
    in_features: int
    out_features: int
    relu_after: bool


# (input_shape (C, H, W), num_classes, the arch's validated params) -> (body, Linear stack)
LayersFn = Callable[[tuple[int, ...], int, Any], tuple[nn.Module, list[LinearSpec]]]


@dataclass(frozen=True)
class ModelSpec:
    """One arch. `linear_layers` is the length of the Linear stack `layers` returns (so
    model.head_layers may be 1..linear_layers); `min_side` the smallest image side it accepts;
    `linear_only` whether those Linear layers are its only trainable layers (an MLP)."""

    name: str
    layers: LayersFn
    linear_layers: int
    min_side: int = 1
    linear_only: bool = False
    Params: type[ModelParams] = ModelParams
    description: str = ""


MODELS.accept(ModelSpec)  # plugin entries in autofl.models must be ModelSpecs

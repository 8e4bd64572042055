"""FedProx: CE + mu/2 * ||w - w_global||^2."""

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.losses import proximal
from autofl.methods.base import ClientContext, Method, MethodParams
from autofl.methods.registry import register


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="weight of the proximal term")


@register
class FedProx(Method):
    name = "fedprox"
    Params = FedProxParams

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = dict(ctx.model.named_parameters())
        return F.cross_entropy(ctx.model(x), y) + self.params.mu / 2 * proximal(params, ctx.global_state)

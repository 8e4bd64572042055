"""MOON: CE + mu * contrast(z, z_global, z_prev), z = projector output (encoder output if none)."""

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.losses import contrastive_pair
from autofl.methods.base import ClientContext, LocalResult, Method, MethodParams, clone_state, frozen_copy_into, sgd_epochs
from autofl.methods.registry import register


class MoonParams(MethodParams):
    mu: float = Field(1.0, ge=0, description="weight of the model-contrastive term")
    tau: float = Field(0.5, gt=0, description="temperature")


@register
class Moon(Method):
    name = "moon"
    Params = MoonParams
    uses_projector = True
    default_projector_depth = 0
    extra_forwards = 2  # frozen global and previous models

    def local_train(self, ctx: ClientContext) -> LocalResult:
        model = ctx.model
        glob = frozen_copy_into(self.spare("glob", model), ctx.global_state)
        prev_state = ctx.state.get("prev")
        prev = frozen_copy_into(self.spare("prev", model), prev_state) if prev_state is not None else None
        embed = lambda m, x: m.projector(m.encoder(x))  # noqa: E731

        def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = embed(model, x)
            ce = F.cross_entropy(model.head(z), y)
            if prev is None:
                return ce
            with torch.no_grad():
                z_g, z_p = embed(glob, x), embed(prev, x)
            return ce + self.params.mu * contrastive_pair(z, z_g, z_p, self.params.tau)

        result = sgd_epochs(ctx, model.parameters(), ctx.local_epochs, loss_fn)
        ctx.state["prev"] = clone_state(model)
        return result

"""FDCL (spec §3): CE + mu * (l_e + l_c), two-directional contrast of encoder features and logits.

l_e pulls the local encoder output towards the global model's and away from the previous local
model's; l_c pulls the local logits towards the previous model's and away from the global's.
"""

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.losses import contrastive_pair
from autofl.methods.base import (ClientContext, LocalResult, Method, MethodParams, StateDict, clone_state,
                                 frozen_copy_into, sgd_epochs)
from autofl.methods.registry import register
from autofl.models.parts import SplitModel


class FDCLParams(MethodParams):
    mu: float = Field(0.1, ge=0, description="weight of l_e + l_c (paper range 0.05..2)")
    tau: float = Field(0.5, gt=0, description="temperature")


def fdcl_terms(pe: tuple[torch.Tensor, ...], pc: tuple[torch.Tensor, ...], tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(l_e, l_c) from (local, global, previous) encoder outputs `pe` and logits `pc`."""
    pe_l, pe_g, pe_p = pe
    pc_l, pc_g, pc_p = pc
    l_e = contrastive_pair(pe_l, pe_g, pe_p, tau)  # positive: global
    l_c = contrastive_pair(pc_l, pc_p, pc_g, tau)  # positive: previous
    return l_e, l_c


@register
class FDCL(Method):
    name = "fdcl"
    Params = FDCLParams
    personal_is_global = False
    extra_forwards = 2  # frozen global and previous models

    def local_train(self, ctx: ClientContext) -> LocalResult:
        model = ctx.model
        prev_state = ctx.state.get("prev")
        if prev_state is None:  # first participation: both terms are 0
            result = sgd_epochs(ctx, model.parameters(), ctx.local_epochs, lambda x, y: F.cross_entropy(model(x), y))
        else:
            glob = frozen_copy_into(self.spare("glob", model), ctx.global_state)
            prev = frozen_copy_into(self.spare("prev", model), prev_state)

            def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                pe_l = model.encoder(x)
                pc_l = model.head(pe_l)
                with torch.no_grad():
                    pe_g, pe_p = glob.encoder(x), prev.encoder(x)
                    pc_g, pc_p = glob.head(pe_g), prev.head(pe_p)
                l_e, l_c = fdcl_terms((pe_l, pe_g, pe_p), (pc_l, pc_g, pc_p), self.params.tau)
                return F.cross_entropy(pc_l, y) + self.params.mu * (l_e + l_c)

            result = sgd_epochs(ctx, model.parameters(), ctx.local_epochs, loss_fn)
        ctx.state["prev"] = clone_state(model)  # also the client's personal model
        return result

    def load_personal(self, model: SplitModel, global_state: StateDict, client_state: dict) -> None:
        model.load_state_dict(client_state.get("prev", global_state))

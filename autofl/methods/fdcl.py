"""FDCL (spec §3): CE + mu * (l_e + l_c), two-directional contrast of encoder features and logits.

l_e pulls the local encoder output towards the global model's and away from the previous local
model's; l_c pulls the local logits towards the previous model's and away from the global's.
"""

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict
from autofl.losses import contrastive_pair
from autofl.methods.base import ClientStart, Method, MethodParams, ModelCopies, ServerState
from autofl.methods.registry import register
from autofl.models.parts import SplitModel


class FDCLParams(MethodParams):
    mu: float = Field(0.1, ge=0, description="weight of l_e + l_c (paper range 0.05..2)", json_schema_extra=FUSIBLE)
    tau: float = Field(0.5, gt=0, description="temperature", json_schema_extra=FUSIBLE)


def fdcl_terms(
    pe: tuple[torch.Tensor, ...], pc: tuple[torch.Tensor, ...], tau: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(l_e, l_c) from (local, global, previous) encoder outputs `pe` and logits `pc`."""
    pe_l, pe_g, pe_p = pe
    pc_l, pc_g, pc_p = pc
    l_e = contrastive_pair(pe_l, pe_g, pe_p, tau)  # positive: global
    l_c = contrastive_pair(pc_l, pc_p, pc_g, tau)  # positive: previous
    return l_e, l_c


@register
class FDCL(Method):
    name = "fdcl"
    trains_encoder_features = True
    Params = FDCLParams
    params: FDCLParams  # the validated Params (Method.__init__)
    personal_is_global = False
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags
    copies = ("glob", "prev")  # frozen: the received global model, the client's previous local model

    def client_start(self, global_state: StateDict, client_state: dict, server: ServerState) -> ClientStart:
        return self.start_with_previous(global_state, client_state)

    def loss(self, ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
        model = ws.model
        pe_l = model.encoder(x)
        pc_l = model.head(pe_l)
        with torch.no_grad():
            pe_g, pe_p = ws.glob.encoder(x), ws.prev.encoder(x)
            pc_g, pc_p = ws.glob.head(pe_g), ws.prev.head(pe_p)
        l_e, l_c = fdcl_terms((pe_l, pe_g, pe_p), (pc_l, pc_g, pc_p), self.fused(flags, "tau"))
        return F.cross_entropy(pc_l, y) + flags["has_prev"] * self.fused(flags, "mu") * (l_e + l_c)

    def remember(self, trained: StateDict, client_state: dict) -> None:
        client_state["prev"] = trained  # also the client's personal model

    def load_personal(
        self, model: SplitModel, global_state: StateDict, client_state: dict, server: ServerState
    ) -> None:
        model.load_state_dict(client_state.get("prev", global_state))

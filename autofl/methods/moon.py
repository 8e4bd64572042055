"""MOON: CE + mu * contrast(z, z_global, z_prev), z = projector output (encoder output if none)."""

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict
from autofl.losses import contrastive_pair
from autofl.methods.base import ClientStart, Method, MethodParams, ModelCopies, ServerState
from autofl.methods.registry import register
from autofl.models.parts import SplitModel


class MoonParams(MethodParams):
    mu: float = Field(1.0, ge=0, description="weight of the model-contrastive term", json_schema_extra=FUSIBLE)
    tau: float = Field(0.5, gt=0, description="temperature", json_schema_extra=FUSIBLE)


def embed(model: SplitModel, x: torch.Tensor) -> torch.Tensor:
    return model.projector(model.encoder(x))


@register
class Moon(Method):
    name = "moon"
    Params = MoonParams
    params: MoonParams  # the validated Params (Method.__init__)
    uses_projector = True
    default_projector_depth = 0
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags
    copies = ("glob", "prev")  # frozen: the received global model, the client's previous local model

    def client_start(self, global_state: StateDict, client_state: dict, server: ServerState) -> ClientStart:
        return self.start_with_previous(global_state, client_state)

    def loss(self, ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
        z = embed(ws.model, x)
        ce = F.cross_entropy(ws.model.head(z), y)
        with torch.no_grad():
            z_g, z_p = embed(ws.glob, x), embed(ws.prev, x)
        return ce + flags["has_prev"] * self.fused(flags, "mu") * contrastive_pair(
            z, z_g, z_p, self.fused(flags, "tau")
        )

    def remember(self, trained: StateDict, client_state: dict) -> None:
        client_state["prev"] = trained

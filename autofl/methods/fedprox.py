"""FedProx: CE + mu/2 * ||w - w_global||^2."""

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict
from autofl.methods.base import ClientStart, Method, MethodParams, ModelCopies, ServerState
from autofl.methods.registry import register


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="weight of the proximal term", json_schema_extra=FUSIBLE)


@register
class FedProx(Method):
    name = "fedprox"
    Params = FedProxParams
    params: FedProxParams  # the validated Params (Method.__init__)
    copies = ("glob",)  # the received global model: the proximal anchor
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

    def client_start(self, global_state: StateDict, client_state: dict, server: ServerState) -> ClientStart:
        return ClientStart({"model": self.start_state(global_state, client_state), "glob": global_state})

    def loss(self, ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
        anchor = dict(ws.glob.named_parameters())
        ce = F.cross_entropy(ws.model(x), y)
        return ce + self.fused(flags, "mu") / 2 * ws.proximal(dict(ws.model.named_parameters()), anchor)

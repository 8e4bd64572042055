"""FedProto (Tan et al., AAAI'22; spec §2): no weights are shared. Each client uploads its local
prototypes (per-class mean encoder features); the server averages them per class, weighted by the
clients' sample counts, into global prototypes P. Local loss CE + lambda * ||f(x) - P_y||^2 over
samples whose class has a global prototype. A client predicts the class of the nearest global
prototype to f(x), as PFLlib evaluates FedProto.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.features import ClassStats, encoded_class_stats, weighted_class_means
from autofl.losses import prototype_distance
from autofl.methods.base import (
    ClientStart,
    Method,
    MethodParams,
    ModelCopies,
    ServerContext,
    ServerState,
    ServerUpdate,
    Sharing,
    Stage,
    StateDict,
    TrainedClient,
    Update,
    Upload,
)
from autofl.methods.registry import register
from autofl.models.parts import SplitModel


class FedProtoParams(MethodParams):
    lam: float = Field(
        1.0, ge=0, description="lambda: weight of the prototype distance (paper 1)", json_schema_extra=FUSIBLE
    )
    distance: Literal["squared_l2", "mse"] = Field(
        "squared_l2",
        description="the prototype distance: squared_l2 = ||f(x) - P_y||^2 (the paper's L2), mse = "
        "that divided by the feature width (PFLlib's and the official code's nn.MSELoss)",
    )


def global_prototypes(local: list[ClassStats]) -> tuple[torch.Tensor, torch.Tensor]:
    """P_j = sum_i |D_ij| / N_j * C_i^(j) over the clients holding class j, and which classes have one."""
    return weighted_class_means(local)


def nearest_prototype_scores(
    features: torch.Tensor, prototypes: torch.Tensor, has_prototype: torch.Tensor
) -> torch.Tensor:
    """-||f(x) - P_k||^2 per class (-inf for classes without a prototype): argmax = nearest prototype."""
    dist = ((features[:, None, :] - prototypes[None, :, :]) ** 2).sum(dim=2)
    return (-dist).masked_fill(~has_prototype[None, :], float("-inf"))


@dataclass(frozen=True)
class FedProtoState(ServerState):
    prototypes: torch.Tensor | None = None  # (C, d) global prototypes; None before the first round's uploads
    has_prototype: torch.Tensor | None = None  # (C,) bool: which classes have one


@register
class FedProto(Method):
    name = "fedproto"
    sharing = Sharing(local=("*",))  # only prototypes go up: every weight stays on its client
    Params = FedProtoParams
    params: FedProtoParams  # the validated Params (Method.__init__)
    State = FedProtoState
    trains_encoder_features = True
    has_global_model = False  # no weights are aggregated: there is no global model
    personal_is_global = False
    # the loss reads lambda through `fused` and the prototypes through the clients' flags (`client_start`),
    # so each config of a population has its own
    population_ready = True

    # ----- server ----------------------------------------------------------------------------
    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate:
        """Global prototypes from this round's uploads (PFLlib: the sampled clients' prototypes)."""
        return ServerUpdate(state=FedProtoState(*global_prototypes([u.payload["protos"] for u in uploads])))

    # ----- client ----------------------------------------------------------------------------
    def client_start(self, global_state: StateDict, client_state: dict[str, Any], server: ServerState) -> ClientStart:
        """The global prototypes, once there are any, as the client's flags (what it downloaded)."""
        assert isinstance(server, FedProtoState)  # the engine passes this method's State
        start = super().client_start(global_state, client_state, server)
        if server.prototypes is None or server.has_prototype is None:
            return start
        return ClientStart(start.models, {**start.flags, "protos": server.prototypes, "has": server.has_prototype})

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """CE(h(f(x)), y) + lambda * distance(f(x), P_y); CE alone before any global prototype (the
        first round's, whoever takes part: every config of a population has them from the same round)."""
        assert isinstance(server, FedProtoState)  # the engine passes this method's State
        per_dim = self.params.distance == "mse"
        if server.prototypes is None or server.has_prototype is None:
            return [Stage((Update(("model.",), self.loss),))]

        def loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            f = ws.model.encoder(x)
            distance = prototype_distance(f, y, flags["protos"], flags["has"], per_dim)
            return F.cross_entropy(ws.model.head(ws.model.projector(f)), y) + self.fused(flags, "lam") * distance

        return [Stage((Update(("model.",), loss),))]

    def server_payload(self, server: ServerState) -> dict[str, Any]:
        """The global prototypes (none before the first round's uploads)."""
        assert isinstance(server, FedProtoState)  # the engine passes this method's State
        return {"prototypes": server.prototypes, "has_prototype": server.has_prototype}

    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        return {
            "protos": encoded_class_stats(
                client.model.encoder, client.x, client.y, client.train_idx, client.num_classes
            )
        }

    # ----- evaluation ------------------------------------------------------------------------
    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict, server: ServerState) -> torch.Tensor:
        """The nearest global prototype's class; the client's own head before any prototype exists."""
        assert isinstance(server, FedProtoState)  # the engine passes this method's State
        if server.prototypes is None or server.has_prototype is None:
            return model(x)
        return nearest_prototype_scores(model.encoder(x), server.prototypes, server.has_prototype)

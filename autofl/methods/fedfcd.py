"""FedFCD (spec §7): private feature extractor theta_i and personal head phi_i; a global head phi_g
trained only on the server from clients' local feature representations (LFRs); global feature
representations (GFRs) regularize the extractor. Prediction fuses both heads' logits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.cost import tensor_bytes
from autofl.features import ClassStats, class_mean_pairs, encoded_class_stats, train_head, weighted_class_means
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
from autofl.models.parts import SplitModel, build_head

# the seed stream of the server's batch order when it trains the global head: a number kept from before streams
# were named by strings, so that runs reproduce (a new method names its streams: ctx.generator("..."))
GLOBAL_HEAD_STREAM = 0xFCD


class FedFCDParams(MethodParams):
    lam: float = Field(
        1.0,
        ge=0,
        description="lambda: weight of the GFR regularizer (paper 1 FMNIST, 5 CIFAR)",
        json_schema_extra=FUSIBLE,
    )
    server_lr: float = Field(
        0.01, gt=0, description="eta_g: server learning rate of the global head", json_schema_extra=FUSIBLE
    )
    server_lfrs: Literal["round", "latest"] = Field(
        "round",
        description="what phi_g and the GFRs learn from when participation < 1: this round's uploads "
        "(the paper's Algorithm 1, as PFLlib's FedProto) or every client's latest upload (stale for unsampled clients)",
    )


def gfr_regularizer(features: torch.Tensor, y: torch.Tensor, gfr: torch.Tensor, has_gfr: torch.Tensor) -> torch.Tensor:
    """mean over the batch of ||f(x) - C_y||^2 / d; samples whose class has no GFR add 0."""
    return prototype_distance(features, y, gfr, has_gfr, per_dim=True)


def global_feature_representations(lfrs: list[ClassStats]) -> tuple[torch.Tensor, torch.Tensor]:
    """C_j = sum_i |D_ij| / N_j * C_i^(j) over the clients holding class j."""
    return weighted_class_means(lfrs)


@dataclass(frozen=True)
class FedFCDState(ServerState):
    lfrs: dict[int, ClassStats] = field(default_factory=dict)  # the LFRs and counts the server learns from
    gfr: torch.Tensor | None = None  # (C, d) global feature representations C_j
    has_gfr: torch.Tensor | None = None  # (C,) bool


@register
class FedFCD(Method):
    name = "fedfcd"
    # only prototypes go up; phi_g is trained on the server and downloaded by every sampled client
    sharing = Sharing(local=("*",), server_trained=("global_head.*",))
    trains_encoder_features = True
    Params = FedFCDParams
    params: FedFCDParams  # the validated Params (Method.__init__)
    State = FedFCDState
    has_global_model = False  # no whole global model: global_* metrics are not reported
    personal_is_global = False
    # the loss reads lambda through `fused` and the GFRs through the clients' flags (`client_start`), so
    # each config of a population has its own; server_lr acts on the server alone
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

    def build_model(self) -> SplitModel:
        model = super().build_model()
        model.global_head = build_head(self.exp.model, self.input_shape, self.num_classes)
        return model

    def server_payload(self, server: ServerState) -> dict[str, Any]:
        """The GFRs the extractor's regularizer pulls towards."""
        assert isinstance(server, FedFCDState)  # the engine passes this method's State
        return {"gfr": server.gfr, "has_gfr": server.has_gfr}

    # ----- server ----------------------------------------------------------------------------
    def init_server(self, ctx: ServerContext) -> ServerUpdate:
        """Before round 1 every client uploads LFRs of its initial extractor; train phi_g, build GFRs."""
        ctx.model.load_state_dict(ctx.global_state)
        d = ctx.data
        lfrs = {
            cid: encoded_class_stats(ctx.model.encoder, d.x, d.y, split.train, d.num_classes)
            for cid, split in enumerate(d.clients)
        }
        # every client sends the LFRs of its initial extractor (a shared seed: nothing downloaded)
        return dataclasses.replace(self._server_step(ctx, lfrs), upload_bytes=tensor_bytes(lfrs))

    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate:
        """phi_g and the GFRs learn from this round's uploads (or, with server_lfrs "latest", from
        every client's latest upload); the same thing when every client takes part."""
        fresh = {u.cid: u.payload["lfr"] for u in uploads}
        assert isinstance(ctx.state, FedFCDState)  # the engine passes this method's State
        return self._server_step(ctx, {**ctx.state.lfrs, **fresh} if self.params.server_lfrs == "latest" else fresh)

    def _server_step(self, ctx: ServerContext, lfrs: dict[int, ClassStats]) -> ServerUpdate:
        stats = [lfrs[c] for c in sorted(lfrs)]
        gfr, has_gfr = global_feature_representations(stats)
        feats, labels = class_mean_pairs(stats)
        head = self.spare("global_head", ctx.model.global_head)
        head.load_state_dict(
            {k[len("global_head.") :]: v for k, v in ctx.global_state.items() if k.startswith("global_head.")}
        )
        train_head(
            head, feats, labels, self.params.server_lr, self.exp.fl.batch_size, ctx.generator(GLOBAL_HEAD_STREAM)
        )
        return ServerUpdate(
            global_state={"global_head." + k: v.detach().clone() for k, v in head.state_dict().items()},
            state=FedFCDState(lfrs, gfr, has_gfr),
        )

    # ----- client ----------------------------------------------------------------------------
    def client_start(self, global_state: StateDict, client_state: dict[str, Any], server: ServerState) -> ClientStart:
        """The GFRs the extractor's regularizer pulls towards, as the client's flags (what it downloaded)."""
        assert isinstance(server, FedFCDState)  # the engine passes this method's State
        assert server.gfr is not None and server.has_gfr is not None  # set by init_server
        start = super().client_start(global_state, client_state, server)
        return ClientStart(start.models, {**start.flags, "gfr": server.gfr, "has_gfr": server.has_gfr})

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """Per batch: (a) phi_i frozen, theta on CE(h_p(phi_i; f(x)), y) + lambda * GFR regularizer;
        (b) theta frozen, phi_i on CE(h_g(phi_g; z) + h_p(phi_i; z), y), z = sg(f(x)) after step (a).
        phi_g is never trained here. Step (a) is left out when the extractor has no parameters."""

        def extractor_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            f = ws.model.encoder(x)
            regularizer = gfr_regularizer(f, y, flags["gfr"], flags["has_gfr"])
            return F.cross_entropy(ws.model.head(f), y) + self.fused(flags, "lam") * regularizer

        def head_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            with torch.no_grad():
                z = ws.model.encoder(x)
            return F.cross_entropy(ws.model.global_head(z) + ws.model.head(z), y)

        has_extractor = self.layout.trains("encoder.")  # none when the head takes every layer
        head = Update(("model.head.",), head_loss, report=None if has_extractor else "loss")
        if not has_extractor:
            return [Stage((head,))]
        return [Stage((Update(("model.encoder.",), extractor_loss), head))]

    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        return {
            "lfr": encoded_class_stats(client.model.encoder, client.x, client.y, client.train_idx, client.num_classes)
        }

    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict, server: ServerState) -> torch.Tensor:
        f = model.encoder(x)
        return model.global_head(f) + model.head(f)

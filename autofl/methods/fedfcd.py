"""FedFCD (spec §7): private feature extractor theta_i and personal head phi_i; a global head phi_g
trained only on the server from clients' local feature representations (LFRs); global feature
representations (GFRs) regularize the extractor. Prediction fuses both heads' logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.features import ClassStats, encoded_class_stats, train_head
from autofl.engine.state import StateDict
from autofl.methods.base import Method, MethodParams, Stage, TrainedClient, Update, Upload
from autofl.methods.registry import register
from autofl.models.parts import SplitModel, build_head
from autofl.seeding import derived_seed

if TYPE_CHECKING:
    from autofl.engine.simulation import Simulation


class FedFCDParams(MethodParams):
    lam: float = Field(1.0, ge=0, description="lambda: weight of the GFR regularizer (paper 1 FMNIST, 5 CIFAR)")
    server_lr: float = Field(0.01, gt=0, description="eta_g: server learning rate of the global head")
    server_lfrs: Literal["round", "latest"] = Field(
        "round", description="what phi_g and the GFRs learn from when participation < 1: this round's uploads "
        "(the paper's Algorithm 1, as PFLlib's FedProto) or every client's latest upload (stale for unsampled clients)")


def gfr_regularizer(features: torch.Tensor, y: torch.Tensor, gfr: torch.Tensor, has_gfr: torch.Tensor) -> torch.Tensor:
    """mean over the batch of ||f(x) - C_y||^2 / d; samples whose class has no GFR add 0."""
    d = features.shape[1]
    dist = ((features - gfr[y]) ** 2).sum(dim=1) / d
    return (dist * has_gfr[y]).sum() / len(y)


def global_feature_representations(lfrs: list[ClassStats]) -> tuple[torch.Tensor, torch.Tensor]:
    """C_j = sum_i |D_ij| / N_j * C_i^(j) over the clients holding class j."""
    counts = torch.stack([s.counts for s in lfrs])  # (K, C)
    means = torch.stack([s.means for s in lfrs])  # (K, C, d)
    n = counts.sum(0)
    gfr = (counts[:, :, None] * means).sum(0) / n.clamp(min=1)[:, None]
    return gfr, n > 0


@register
class FedFCD(Method):
    name = "fedfcd"
    trains_encoder_features = True
    Params = FedFCDParams
    has_global_model = False  # no whole global model: global_* metrics are not reported
    personal_is_global = False
    extra_forwards = 2  # features recomputed for step (b) after step (a); the LFR pass after training

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lfrs: dict[int, ClassStats] = {}  # the LFRs and counts the server learns from (see server_lfrs)
        self.gfr: torch.Tensor | None = None
        self.has_gfr: torch.Tensor | None = None

    def build_model(self) -> SplitModel:
        model = super().build_model()
        model.global_head = build_head(self.exp.model, self.input_shape, self.num_classes)
        self.has_extractor = any(True for _ in model.encoder.parameters())  # none when the head takes every layer
        return model

    def shared_keys(self, model: SplitModel) -> list[str]:
        return []  # only prototypes go up; phi_g is trained on the server

    # ----- server ----------------------------------------------------------------------------
    def setup(self, sim: "Simulation") -> None:
        """Before round 1 every client uploads LFRs of its initial extractor; train phi_g, build GFRs."""
        sim.model.load_state_dict(sim.global_state)
        d = sim.data
        for cid, split in enumerate(d.clients):
            self.lfrs[cid] = encoded_class_stats(sim.model.encoder, d.x, d.y, split.train, d.num_classes)
        self._server_step(sim)

    def server_update(self, sim: "Simulation", uploads: list[Upload]) -> None:
        """phi_g and the GFRs learn from this round's uploads (or, with server_lfrs "latest", from
        every client's latest upload); the same thing when every client takes part."""
        fresh = {u.cid: u.payload["lfr"] for u in uploads}
        self.lfrs = {**self.lfrs, **fresh} if self.params.server_lfrs == "latest" else fresh
        self._server_step(sim)

    def _server_step(self, sim: "Simulation") -> None:
        stats = [self.lfrs[c] for c in sorted(self.lfrs)]
        self.gfr, self.has_gfr = global_feature_representations(stats)
        feats = torch.cat([s.means[s.counts > 0] for s in stats])
        labels = torch.cat([torch.nonzero(s.counts > 0).flatten() for s in stats])
        head = self.spare("global_head", sim.model.global_head)
        head.load_state_dict({k[len("global_head."):]: v for k, v in sim.global_state.items()
                              if k.startswith("global_head.")})
        train_head(head, feats, labels, self.params.server_lr, self.exp.fl.batch_size,
                   torch.Generator().manual_seed(derived_seed(self.exp.seed, sim.round, 0xFCD)))
        for k, v in head.state_dict().items():
            sim.global_state["global_head." + k] = v.detach().clone()

    # ----- client ----------------------------------------------------------------------------
    def local_stages(self, rnd: int) -> list[Stage]:
        """Per batch: (a) phi_i frozen, theta on CE(h_p(phi_i; f(x)), y) + lambda * GFR regularizer;
        (b) theta frozen, phi_i on CE(h_g(phi_g; z) + h_p(phi_i; z), y), z = sg(f(x)) after step (a).
        phi_g is never trained here. Step (a) is left out when the extractor has no parameters."""
        gfr, has_gfr, lam = self.gfr, self.has_gfr, self.params.lam
        assert gfr is not None and has_gfr is not None

        def extractor_loss(ws: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            f = ws.model.encoder(x)
            return F.cross_entropy(ws.model.head(f), y) + lam * gfr_regularizer(f, y, gfr, has_gfr)

        def head_loss(ws: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            with torch.no_grad():
                z = ws.model.encoder(x)
            return F.cross_entropy(ws.model.global_head(z) + ws.model.head(z), y)

        head = Update(("model.head.",), head_loss, report=None if self.has_extractor else "loss")
        if not self.has_extractor:
            return [Stage((head,))]
        return [Stage((Update(("model.encoder.",), extractor_loss), head))]

    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        return {"lfr": encoded_class_stats(client.model.encoder, client.x, client.y, client.train_idx,
                                           client.num_classes)}

    def keep_private(self, trained: StateDict, client_state: dict, shared: list[str]) -> None:
        """Everything but phi_g, which the server trains and sends (nothing is aggregated)."""
        client_state["private"] = {k: v for k, v in trained.items() if not k.startswith("global_head.")}

    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict) -> torch.Tensor:
        f = model.encoder(x)
        return model.global_head(f) + model.head(f)

    def server_state(self) -> dict[str, Any]:
        return {"lfrs": self.lfrs, "gfr": self.gfr, "has_gfr": self.has_gfr}

    def load_server_state(self, state: dict[str, Any]) -> None:
        self.lfrs = {int(k): v for k, v in state["lfrs"].items()}
        self.gfr, self.has_gfr = state["gfr"], state["has_gfr"]


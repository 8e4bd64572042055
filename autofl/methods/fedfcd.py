"""FedFCD (spec §7): private feature extractor theta_i and personal head phi_i; a global head phi_g
trained only on the server from clients' local feature representations (LFRs); global feature
representations (GFRs) regularize the extractor. Prediction fuses both heads' logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.features import ClassStats, encoded_class_stats, train_head
from autofl.methods.base import (ClientContext, LocalResult, LossMeter, Method, MethodParams, StateDict, Upload,
                                 clone_state)
from autofl.methods.registry import register
from autofl.models.parts import SplitModel, build_head
from autofl.seeding import derived_seed

if TYPE_CHECKING:
    from autofl.engine.simulation import Simulation


class FedFCDParams(MethodParams):
    lam: float = Field(1.0, ge=0, description="lambda: weight of the GFR regularizer (paper 1 FMNIST, 5 CIFAR)")
    server_lr: float = Field(0.01, gt=0, description="eta_g: server learning rate of the global head")


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
    Params = FedFCDParams
    has_global_model = False  # no whole global model: global_* metrics are not reported
    personal_is_global = False
    extra_forwards = 2  # features recomputed for step (b) after step (a); the LFR pass after training

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lfrs: dict[int, ClassStats] = {}  # latest LFRs and counts each client uploaded
        self.gfr: torch.Tensor | None = None
        self.has_gfr: torch.Tensor | None = None

    def build_model(self) -> SplitModel:
        model = super().build_model()
        model.global_head = build_head(self.exp.model, self.input_shape, self.num_classes)
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
        for u in uploads:
            self.lfrs[u.cid] = u.payload["lfr"]
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
    def local_train(self, ctx: ClientContext) -> LocalResult:
        model = ctx.model
        model.train()
        for p in model.global_head.parameters():
            p.requires_grad_(False)
        extractor = list(model.encoder.parameters())  # empty when the head takes every Linear layer
        opt_theta = ctx.optimizer(extractor) if extractor else None
        opt_phi = ctx.optimizer(model.head.parameters())
        meter = LossMeter(ctx.device)
        for _ in range(ctx.local_epochs):
            for x, y in ctx.batches():
                loss_a = self.step_extractor(model, x, y, opt_theta) if opt_theta is not None else None
                loss_b = self.step_personal_head(model, x, y, opt_phi)
                meter.add(loss_a if loss_a is not None else loss_b, len(y))
        lfr = encoded_class_stats(model.encoder, ctx.x, ctx.y, ctx.train_idx, ctx.num_classes)
        return LocalResult(num_samples=len(ctx.train_idx), loss=meter.mean(), payload={"lfr": lfr})

    def step_extractor(self, model: SplitModel, x: torch.Tensor, y: torch.Tensor,
                       opt_theta: torch.optim.Optimizer) -> torch.Tensor:
        """(a) phi_i frozen: theta on CE(h_p(phi_i; f(x)), y) + lambda * GFR regularizer."""
        assert self.gfr is not None and self.has_gfr is not None
        f = model.encoder(x)
        loss = F.cross_entropy(model.head(f), y) + self.params.lam * gfr_regularizer(f, y, self.gfr, self.has_gfr)
        opt_theta.zero_grad(set_to_none=True)
        loss.backward(inputs=list(model.encoder.parameters()))  # no gradient reaches phi_i
        opt_theta.step()
        return loss.detach()

    def step_personal_head(self, model: SplitModel, x: torch.Tensor, y: torch.Tensor,
                           opt_phi: torch.optim.Optimizer) -> torch.Tensor:
        """(b) theta frozen: phi_i on CE(h_g(phi_g; z) + h_p(phi_i; z), y), z = sg(f(x)) after step (a)."""
        with torch.no_grad():
            z = model.encoder(x)
        loss = F.cross_entropy(model.global_head(z) + model.head(z), y)
        opt_phi.zero_grad(set_to_none=True)
        loss.backward()
        opt_phi.step()
        return loss.detach()

    def keep_private(self, ctx: ClientContext, shared: list[str]) -> None:
        """Everything but phi_g, which the server trains and sends (nothing is aggregated)."""
        keys = [k for k in ctx.model.state_dict() if not k.startswith("global_head.")]
        ctx.state["private"] = clone_state(ctx.model, keys)

    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict) -> torch.Tensor:
        f = model.encoder(x)
        return model.global_head(f) + model.head(f)

    def server_state(self) -> dict[str, Any]:
        return {"lfrs": self.lfrs, "gfr": self.gfr, "has_gfr": self.has_gfr}

    def load_server_state(self, state: dict[str, Any]) -> None:
        self.lfrs = {int(k): v for k, v in state["lfrs"].items()}
        self.gfr, self.has_gfr = state["gfr"], state["has_gfr"]


"""FedSiam-DA (spec §6): a Siamese pair of the local model and a trainable copy f' of the received
global model, a history term against the previous local epoch's snapshot, a predictor head, and
dual (cosine-similarity-weighted) aggregation on the server.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from autofl.losses import negative_cosine
from autofl.methods.base import (ClientContext, LocalResult, LossMeter, Method, MethodParams, StateDict, Upload,
                                 clone_state, frozen_copy_into, weighted_average)
from autofl.methods.registry import register
from autofl.models.parts import SplitModel

PREDICTOR_HIDDEN = 64


class FedSiamDAParams(MethodParams):
    mu: float = Field(0.1, ge=0, description="weight of the Siamese and history terms (tested 0.05..1)")


def build_predictor(dim: int) -> nn.Module:
    """q: Linear(d, 64, no bias) BN ReLU Linear(64, d)."""
    return nn.Sequential(nn.Linear(dim, PREDICTOR_HIDDEN, bias=False), nn.BatchNorm1d(PREDICTOR_HIDDEN), nn.ReLU(),
                         nn.Linear(PREDICTOR_HIDDEN, dim))


def dual_weights(states: list[StateDict], param_keys: list[str]) -> list[float]:
    """xi_k = D_k / sum_j D_j, D_k = cos(vec(w_k), vec(w0)), w0 the plain mean, parameters only."""
    vecs = torch.stack([torch.cat([s[k].flatten().double() for k in param_keys]) for s in states])
    w0 = vecs.mean(0, keepdim=True)
    d = F.cosine_similarity(vecs, w0, dim=1)
    return (d / d.sum()).tolist()


def embed(model: SplitModel, x: torch.Tensor) -> torch.Tensor:
    return model.projector(model.encoder(x))


@register
class FedSiamDA(Method):
    name = "fedsiam_da"
    Params = FedSiamDAParams
    uses_projector = True
    default_projector_depth = 2
    min_projector_depth = 1
    personal_is_global = False
    train_passes = 2  # local model and f'
    extra_forwards = 2  # f' recomputed after its step, history snapshot

    def build_model(self) -> SplitModel:
        model = super().build_model()
        model.predictor = build_predictor(model.feature_dim)
        self.param_keys = [name for name, _ in model.named_parameters()]
        return model

    def aggregate(self, uploads: list[Upload]) -> StateDict:
        states = [u.state for u in uploads]
        return weighted_average(states, dual_weights(states, self.param_keys))

    def local_train(self, ctx: ClientContext) -> LocalResult:
        model, mu = ctx.model, self.params.mu
        siamese = self.spare("siamese", model)  # f': a trainable copy of the received global model
        siamese.load_state_dict(ctx.global_state)
        for p in siamese.parameters():
            p.requires_grad_(True)
        siamese.train()
        model.train()
        opt_local = ctx.optimizer(model.parameters())
        opt_siamese = ctx.optimizer(siamese.parameters())
        last_upload = ctx.state.get("personal")
        hist = frozen_copy_into(self.spare("hist", model), last_upload) if last_upload is not None else None
        meter = LossMeter(ctx.device)
        for _ in range(ctx.local_epochs):
            for x, y in ctx.batches():
                z_local = embed(model, x)
                # 1. f' on 1/2 D-(q_f'(z_f'), sg(z_local))
                z_s = embed(siamese, x)
                loss_s = 0.5 * negative_cosine(siamese.predictor(z_s), z_local.detach())
                opt_siamese.zero_grad(set_to_none=True)
                loss_s.backward()
                opt_siamese.step()
                # 2. local on CE + mu (D+(sg(z_hist), z_local) + 1/2 D-(q(z_local), sg(z_f'))), z_f' recomputed
                with torch.no_grad():
                    z_s = embed(siamese, x)
                    z_hist = embed(hist, x) if hist is not None else None
                loss = F.cross_entropy(model.head(z_local), y)
                siam_term = 0.5 * negative_cosine(model.predictor(z_local), z_s)
                hist_term = F.cosine_similarity(z_hist, z_local, dim=1).mean() if z_hist is not None else 0.0
                loss = loss + mu * (hist_term + siam_term)
                opt_local.zero_grad(set_to_none=True)
                loss.backward()
                opt_local.step()
                meter.add(loss, len(y))
            hist = frozen_copy_into(self.spare("hist", model), model.state_dict())  # end of this local epoch
        ctx.state["personal"] = clone_state(model)  # this upload: the next participation's first history
        return LocalResult(num_samples=len(ctx.train_idx), loss=meter.mean())

    def load_personal(self, model: SplitModel, global_state: StateDict, client_state: dict) -> None:
        model.load_state_dict(client_state.get("personal", global_state))

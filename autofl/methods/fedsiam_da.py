"""FedSiam-DA (spec §6): a Siamese pair of the local model and a trainable copy f' of the received
global model, a history term against the previous local epoch's snapshot, a predictor head, and
dual (cosine-similarity-weighted) aggregation on the server.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict, weighted_average
from autofl.losses import negative_cosine
from autofl.methods.base import ClientStart, Method, MethodParams, ModelCopies, ServerState, Stage, Update, Upload
from autofl.methods.registry import register
from autofl.models.parts import SplitModel

PREDICTOR_HIDDEN = 64
EMBED_DIM = 256  # the projector's output z and the predictor's in/out width (paper §5, "z = 256")


class FedSiamDAParams(MethodParams):
    mu: float = Field(
        0.1, ge=0, description="weight of the Siamese and history terms (tested 0.05..1)", json_schema_extra=FUSIBLE
    )


def build_predictor(dim: int) -> nn.Module:
    """q: Linear(d, 64, no bias) BN ReLU Linear(64, d)."""
    return nn.Sequential(
        nn.Linear(dim, PREDICTOR_HIDDEN, bias=False),
        nn.BatchNorm1d(PREDICTOR_HIDDEN),
        nn.ReLU(),
        nn.Linear(PREDICTOR_HIDDEN, dim),
    )


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
    params: FedSiamDAParams  # the validated Params (Method.__init__)
    uses_projector = True
    default_projector_depth = 2
    min_projector_depth = 1
    projector_out_dim = EMBED_DIM
    personal_is_global = False
    copies = ("siamese", "hist")  # f'; the frozen history model
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags
    scratch_copies = ("siamese",)  # f' is trained and dropped after the round: it restarts from the global model

    def build_model(self) -> SplitModel:
        model = super().build_model()
        model.predictor = build_predictor(model.embed_dim)
        return model

    def aggregate(self, uploads: list[Upload]) -> StateDict:
        states = [u.state for u in uploads]
        return weighted_average(states, dual_weights(states, list(self.layout.parameter_keys)))

    def client_start(self, global_state: StateDict, client_state: dict, server: ServerState) -> ClientStart:
        """f' starts from the received global model; the history is the client's last upload (none
        before its first participation: has_hist = 0 until the end of its first local epoch)."""
        last_upload = client_state.get("personal")
        return ClientStart(
            {
                "model": self.start_state(global_state, client_state),
                "siamese": global_state,
                "hist": last_upload if last_upload is not None else global_state,
            },
            {"has_hist": float(last_upload is not None)},
        )

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """Per batch: 1. f' on 1/2 D-(q_f'(z_f'), sg(z_local)); 2. the local model on
        CE + mu (D+(sg(z_hist), z_local) + 1/2 D-(q(z_local), sg(z_f'))), z_f' recomputed after step 1.
        After each local epoch the history becomes a snapshot of the local model."""

        def siamese_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            with torch.no_grad():
                z_local = embed(ws.model, x)  # the local model's training-mode forward on this batch
            return 0.5 * negative_cosine(ws.siamese.predictor(embed(ws.siamese, x)), z_local)

        def local_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            z_local = embed(ws.model, x)  # same batch statistics as in step 1, counted once (frozen_stats)
            with torch.no_grad():
                z_s = embed(ws.siamese, x)
                z_hist = embed(ws.hist, x)
            ce = F.cross_entropy(ws.model.head(z_local), y)
            siam_term = 0.5 * negative_cosine(ws.model.predictor(z_local), z_s)
            hist_term = flags["has_hist"] * F.cosine_similarity(z_hist, z_local, dim=1).mean()
            return ce + self.fused(flags, "mu") * (hist_term + siam_term)

        siamese = Update(("siamese.encoder.", "siamese.projector.", "siamese.predictor."), siamese_loss, report=None)
        local = Update(("model.",), local_loss, frozen_stats=("model.encoder", "model.projector"))
        return [Stage((siamese, local), snapshot_after_epoch={"hist": "model"}, flags_after_epoch={"has_hist": 1.0})]

    def remember(self, trained: StateDict, client_state: dict) -> None:
        client_state["personal"] = trained  # this upload: the next participation's first history

    def load_personal(
        self, model: SplitModel, global_state: StateDict, client_state: dict, server: ServerState
    ) -> None:
        model.load_state_dict(client_state.get("personal", global_state))

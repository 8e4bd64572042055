"""FedECCR (spec §4): prototype contrast with alpha = 1 - r/R, prototype exchange, and classifier
correction (CCVR) from aggregated class means and covariances of encoder features.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.cost import tensor_bytes
from autofl.engine.state import StateDict, clone_state
from autofl.features import ClassStats, encoded_class_stats, train_head
from autofl.losses import prototype_contrast
from autofl.methods.base import (
    ClientStart,
    Method,
    MethodParams,
    ModelCopies,
    ServerContext,
    ServerState,
    ServerUpdate,
    Stage,
    TrainedClient,
    Update,
    Upload,
)
from autofl.methods.registry import register
from autofl.models.parts import SplitModel

CALIB_LR = 0.01
CALIB_BATCH = 64
CALIB_EPS = 1e-5


# the seed stream of virtual features and batch order of the classifier correction: a number kept from before streams
# were named by strings, so that runs reproduce (a new method names its streams: ctx.generator("..."))
CALIBRATION_STREAM = 0xCCF


class FedECCRParams(MethodParams):
    tau: float = Field(0.5, gt=0, description="temperature of the prototype contrast", json_schema_extra=FUSIBLE)
    M: int = Field(400, ge=1, description="virtual features drawn per class for classifier correction")
    calib_epochs: int = Field(20, ge=0, description="E_cal: epochs of head retraining (0 disables the correction)")
    calibrate_every: int = Field(
        1, ge=0, description="correct at evaluated rounds divisible by this (0: last round only)"
    )
    calib_momentum: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="SGD momentum of the head retraining (FL-bench's CCVR: plain SGD, whatever the clients' momentum)",
    )


def _covariances(stats: ClassStats) -> torch.Tensor:
    """The covariances CCVR's statistics carry (encoded_class_stats with with_cov=True)."""
    assert stats.covs is not None
    return stats.covs


def merge_class_stats(parts: list[ClassStats]) -> ClassStats:
    """Server side of CCVR: pooled per-class mean and unbiased covariance from clients' (n, mu, Sigma).

    mu_k = sum_i n_ik/n_k mu_ik;  Sigma_k = sum_i (n_ik-1)/(n_k-1) Sigma_ik + sum_i n_ik/(n_k-1) mu_ik mu_ik^T
    - n_k/(n_k-1) mu_k mu_k^T, equal to the covariance of the pooled features.
    """
    counts = torch.stack([p.counts for p in parts])  # (K, C)
    means = torch.stack([p.means for p in parts])  # (K, C, d)
    covs = torch.stack([_covariances(p) for p in parts])  # (K, C, d, d)
    n = counts.sum(0)  # (C,)
    mu = (counts[:, :, None] * means).sum(0) / n.clamp(min=1)[:, None]
    denom = (n - 1).clamp(min=1)[:, None, None]
    within = ((counts - 1).clamp(min=0)[:, :, None, None] * covs).sum(0)
    outer = (counts[:, :, None, None] * means[:, :, :, None] * means[:, :, None, :]).sum(0)
    sigma = (within + outer - n[:, None, None] * mu[:, :, None] * mu[:, None, :]) / denom
    sigma = sigma * (n > 1)[:, None, None]
    return ClassStats(n, mu, sigma)


def sample_virtual_features(
    stats: ClassStats, per_class: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw `per_class` features per class from N(mu_k, Sigma_k + eps I), classes with data only."""
    feats, labels = [], []
    d = stats.means.shape[1]
    eye = torch.eye(d, dtype=torch.float64, device=stats.means.device)
    for k in torch.nonzero(stats.counts > 0).flatten().tolist():
        cov = _covariances(stats)[k].double() + CALIB_EPS * eye
        chol, info = torch.linalg.cholesky_ex(cov)
        jitter = CALIB_EPS
        while int(info) != 0:  # numerically indefinite: add jitter until it factorises
            jitter *= 10
            chol, info = torch.linalg.cholesky_ex(cov + jitter * eye)
        noise = torch.randn(per_class, d, generator=generator, dtype=torch.float64).to(cov.device)
        feats.append((stats.means[k].double() + noise @ chol.T).to(stats.means.dtype))
        labels.append(torch.full((per_class,), k, dtype=torch.int64, device=cov.device))
    return torch.cat(feats), torch.cat(labels)


@dataclass(frozen=True)
class FedECCRState(ServerState):
    prototypes: torch.Tensor | None = None  # (C, d) global prototypes z_k
    has_prototype: torch.Tensor | None = None  # (C,) bool
    calibrated: StateDict | None = None  # corrected global model for the round being evaluated
    calibrated_round: int = -1


def updated_prototypes(state: FedECCRState, stats: list[ClassStats]) -> FedECCRState:
    """z_k = mean over the clients that hold class k of their class means; classes no sampled
    client holds keep their previous prototype."""
    holds = torch.stack([s.counts > 0 for s in stats]).to(stats[0].means.dtype)  # (K, C)
    means = torch.stack([s.means for s in stats])  # (K, C, d)
    holders = holds.sum(0)
    new = (holds[:, :, None] * means).sum(0) / holders.clamp(min=1)[:, None]
    present = holders > 0
    if state.prototypes is None or state.has_prototype is None:
        return replace(state, prototypes=new, has_prototype=present)
    return replace(
        state,
        prototypes=torch.where(present[:, None], new, state.prototypes),
        has_prototype=state.has_prototype | present,
    )


@register
class FedECCR(Method):
    name = "fedeccr"
    trains_encoder_features = True
    Params = FedECCRParams
    params: FedECCRParams  # the validated Params (Method.__init__)
    State = FedECCRState
    # the loss reads tau through `fused` and the prototypes through the clients' flags (`client_start`), so
    # each config of a population has its own; alpha depends on the round alone
    population_ready = True

    # ----- server ----------------------------------------------------------------------------
    def init_server(self, ctx: ServerContext) -> ServerUpdate:
        ctx.model.load_state_dict(ctx.global_state)
        d = ctx.data
        stats = [encoded_class_stats(ctx.model.encoder, d.x, d.y, split.train, d.num_classes) for split in d.clients]
        assert isinstance(ctx.state, FedECCRState)  # the engine passes this method's State
        # every client sends its class means of the common initial encoder (a shared seed: nothing downloaded)
        return ServerUpdate(state=updated_prototypes(ctx.state, stats), upload_bytes=tensor_bytes(stats))

    # ----- client ----------------------------------------------------------------------------
    def client_start(self, global_state: StateDict, client_state: dict[str, Any], server: ServerState) -> ClientStart:
        """The global prototypes as the client's flags (what it downloaded)."""
        assert isinstance(server, FedECCRState)  # the engine passes this method's State
        assert server.prototypes is not None and server.has_prototype is not None  # set by init_server
        start = super().client_start(global_state, client_state, server)
        return ClientStart(start.models, {**start.flags, "protos": server.prototypes, "has": server.has_prototype})

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """alpha * L_pc + (1 - alpha) * CE, alpha = 1 - r/R, against this round's global prototypes."""
        assert isinstance(server, FedECCRState)  # the engine passes this method's State
        protos = server.prototypes
        assert protos is not None
        # alpha changes every round: 0-dim tensors (each rounded from the float, as a Python scalar
        # would be) so a compiled step takes them as inputs instead of recompiling each round
        alpha_f = 1.0 - rnd / self.exp.fl.rounds
        alpha, one_minus_alpha = (
            torch.tensor(v, dtype=protos.dtype, device=protos.device) for v in (alpha_f, 1 - alpha_f)
        )

        def loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            f = ws.model.encoder(x)
            ce = F.cross_entropy(ws.model.head(f), y)
            contrast = prototype_contrast(f, y, flags["protos"], flags["has"], self.fused(flags, "tau"))
            return alpha * contrast + one_minus_alpha * ce

        return [Stage((Update(("model.",), loss),))]

    def server_payload(self, server: ServerState) -> dict[str, Any]:
        """The global prototypes the local loss contrasts with."""
        assert isinstance(server, FedECCRState)  # the engine passes this method's State
        return {"prototypes": server.prototypes, "has_prototype": server.has_prototype}

    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        return {
            "class_means": encoded_class_stats(
                client.model.encoder, client.x, client.y, client.train_idx, client.num_classes
            )
        }

    # ----- server ----------------------------------------------------------------------------
    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate:
        assert isinstance(ctx.state, FedECCRState)  # the engine passes this method's State
        state = updated_prototypes(ctx.state, [u.payload["class_means"] for u in uploads])
        last = ctx.completed == ctx.rounds
        every = self.params.calibrate_every
        if self.params.calib_epochs and ctx.evaluated and (last or (every > 0 and ctx.completed % every == 0)):
            # CCVR's statistics: every client receives the new global model and sends (n, mu, Sigma) per class
            clients = len(ctx.data.clients)
            stats_bytes = clients * tensor_bytes(self.calibration_stats_shape(ctx))
            return ServerUpdate(
                state=replace(state, calibrated=self.calibrate(ctx), calibrated_round=ctx.completed),
                upload_bytes=stats_bytes,
                download_bytes=clients * tensor_bytes(dict(ctx.global_state)),
            )
        return ServerUpdate(state=replace(state, calibrated=None, calibrated_round=-1))

    def calibration_stats_shape(self, ctx: ServerContext) -> ClassStats:
        """A client's calibration statistics as sent (counts (C,), means (C, d), covariances
        (C, d, d)), as zeros of their sizes and dtype: what each client uploads for CCVR."""
        c, d, dtype = self.num_classes, ctx.model.feature_dim, next(ctx.model.parameters()).dtype
        return ClassStats(
            torch.zeros(c, dtype=dtype, device="meta"),
            torch.zeros(c, d, dtype=dtype, device="meta"),
            torch.zeros(c, d, d, dtype=dtype, device="meta"),
        )

    def calibrate(self, ctx: ServerContext) -> StateDict:
        """Retrain only the head of a copy of the global model on virtual features (USCC / CCVR)."""
        model = self.spare("calibration", ctx.model)
        model.load_state_dict(ctx.global_state)
        d = ctx.data  # each client's statistics under the current global encoder
        merged = merge_class_stats(
            [
                encoded_class_stats(model.encoder, d.x, d.y, split.train, d.num_classes, with_cov=True)
                for split in d.clients
            ]
        )
        gen = ctx.generator(CALIBRATION_STREAM, ctx.completed)
        feats, labels = sample_virtual_features(merged, self.params.M, gen)
        train_head(
            model.head,
            feats,
            labels,
            CALIB_LR,
            CALIB_BATCH,
            gen,
            epochs=self.params.calib_epochs,
            momentum=self.params.calib_momentum,
        )
        return clone_state(model)

    # ----- evaluation ------------------------------------------------------------------------
    def load_global(self, model: SplitModel, global_state: StateDict, server: ServerState) -> None:
        assert isinstance(server, FedECCRState)  # the engine passes this method's State
        model.load_state_dict(server.calibrated if server.calibrated is not None else global_state)

    def load_personal(
        self, model: SplitModel, global_state: StateDict, client_state: dict, server: ServerState
    ) -> None:
        assert isinstance(server, FedECCRState)  # the engine passes this method's State
        self.load_global(model, global_state, server)

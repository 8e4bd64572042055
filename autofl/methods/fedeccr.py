"""FedECCR (spec §4): prototype contrast with alpha = 1 - r/R, prototype exchange, and classifier
correction (CCVR) from aggregated class means and covariances of encoder features.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.features import ClassStats, encoded_class_stats, train_head
from autofl.losses import prototype_contrast
from autofl.engine.state import StateDict, clone_state
from autofl.methods.base import Method, MethodParams, Stage, TrainedClient, Update, Upload
from autofl.methods.registry import register
from autofl.models.parts import SplitModel
from autofl.seeding import derived_seed

if TYPE_CHECKING:
    from autofl.engine.simulation import Simulation

CALIB_LR = 0.01
CALIB_BATCH = 64
CALIB_EPS = 1e-5


class FedECCRParams(MethodParams):
    tau: float = Field(0.5, gt=0, description="temperature of the prototype contrast")
    M: int = Field(400, ge=1, description="virtual features drawn per class for classifier correction")
    calib_epochs: int = Field(20, ge=0, description="E_cal: epochs of head retraining (0 disables the correction)")
    calibrate_every: int = Field(1, ge=0, description="correct at evaluated rounds divisible by this (0: last round only)")
    calib_momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum of the head retraining (FL-bench's "
                                  "CCVR: plain SGD, whatever the clients' momentum)")


def merge_class_stats(parts: list[ClassStats]) -> ClassStats:
    """Server side of CCVR: pooled per-class mean and unbiased covariance from clients' (n, mu, Sigma).

    mu_k = sum_i n_ik/n_k mu_ik;  Sigma_k = sum_i (n_ik-1)/(n_k-1) Sigma_ik + sum_i n_ik/(n_k-1) mu_ik mu_ik^T
    - n_k/(n_k-1) mu_k mu_k^T, equal to the covariance of the pooled features.
    """
    counts = torch.stack([p.counts for p in parts])  # (K, C)
    means = torch.stack([p.means for p in parts])  # (K, C, d)
    covs = torch.stack([p.covs for p in parts])  # (K, C, d, d)
    n = counts.sum(0)  # (C,)
    mu = (counts[:, :, None] * means).sum(0) / n.clamp(min=1)[:, None]
    denom = (n - 1).clamp(min=1)[:, None, None]
    within = ((counts - 1).clamp(min=0)[:, :, None, None] * covs).sum(0)
    outer = (counts[:, :, None, None] * means[:, :, :, None] * means[:, :, None, :]).sum(0)
    sigma = (within + outer - n[:, None, None] * mu[:, :, None] * mu[:, None, :]) / denom
    sigma = sigma * (n > 1)[:, None, None]
    return ClassStats(n, mu, sigma)


def sample_virtual_features(stats: ClassStats, per_class: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw `per_class` features per class from N(mu_k, Sigma_k + eps I), classes with data only."""
    feats, labels = [], []
    d = stats.means.shape[1]
    eye = torch.eye(d, dtype=torch.float64, device=stats.means.device)
    for k in torch.nonzero(stats.counts > 0).flatten().tolist():
        cov = stats.covs[k].double() + CALIB_EPS * eye
        chol, info = torch.linalg.cholesky_ex(cov)
        jitter = CALIB_EPS
        while int(info) != 0:  # numerically indefinite: add jitter until it factorises
            jitter *= 10
            chol, info = torch.linalg.cholesky_ex(cov + jitter * eye)
        noise = torch.randn(per_class, d, generator=generator, dtype=torch.float64).to(cov.device)
        feats.append((stats.means[k].double() + noise @ chol.T).to(stats.means.dtype))
        labels.append(torch.full((per_class,), k, dtype=torch.int64, device=cov.device))
    return torch.cat(feats), torch.cat(labels)


@register
class FedECCR(Method):
    name = "fedeccr"
    trains_encoder_features = True
    Params = FedECCRParams
    extra_forwards = 1  # the class-mean (prototype) pass over the client's data after training

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prototypes: torch.Tensor | None = None  # (C, d) global prototypes z_k
        self.has_prototype: torch.Tensor | None = None  # (C,) bool
        self.calibrated: StateDict | None = None  # corrected head for the round being evaluated
        self.calibrated_round = -1

    # ----- prototypes ------------------------------------------------------------------------
    def _set_prototypes(self, stats: list[ClassStats]) -> None:
        """z_k = mean over the clients that hold class k of their class means."""
        holds = torch.stack([s.counts > 0 for s in stats]).to(stats[0].means.dtype)  # (K, C)
        means = torch.stack([s.means for s in stats])  # (K, C, d)
        holders = holds.sum(0)
        new = (holds[:, :, None] * means).sum(0) / holders.clamp(min=1)[:, None]
        present = holders > 0
        if self.prototypes is None:
            self.prototypes, self.has_prototype = new, present
        else:  # classes no sampled client holds keep their previous prototype
            self.prototypes = torch.where(present[:, None], new, self.prototypes)
            self.has_prototype = self.has_prototype | present

    def setup(self, sim: "Simulation") -> None:
        sim.model.load_state_dict(sim.global_state)
        d = sim.data
        self._set_prototypes([encoded_class_stats(sim.model.encoder, d.x, d.y, split.train, d.num_classes)
                              for split in d.clients])

    # ----- client ----------------------------------------------------------------------------
    def local_stages(self, rnd: int) -> list[Stage]:
        """alpha * L_pc + (1 - alpha) * CE, alpha = 1 - r/R, against this round's global prototypes."""
        alpha = 1.0 - rnd / self.exp.fl.rounds
        protos, has, tau = self.prototypes, self.has_prototype, self.params.tau
        assert protos is not None and has is not None

        def loss(ws: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            f = ws.model.encoder(x)
            ce = F.cross_entropy(ws.model.head(f), y)
            return alpha * prototype_contrast(f, y, protos, has, tau) + (1 - alpha) * ce

        return [Stage((Update(("model.",), loss),))]

    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        return {"class_means": encoded_class_stats(client.model.encoder, client.x, client.y, client.train_idx,
                                                   client.num_classes)}

    # ----- server ----------------------------------------------------------------------------
    def server_update(self, sim: "Simulation", uploads: list[Upload]) -> None:
        self._set_prototypes([u.payload["class_means"] for u in uploads])
        completed = sim.round + 1
        evaluated = sim.will_evaluate(completed)
        last = completed == self.exp.fl.rounds
        every = self.params.calibrate_every
        if self.params.calib_epochs and evaluated and (last or (every > 0 and completed % every == 0)):
            self.calibrated = self.calibrate(sim, completed)
            self.calibrated_round = completed
        else:
            self.calibrated, self.calibrated_round = None, -1

    def calibrate(self, sim: "Simulation", completed: int) -> StateDict:
        """Retrain only the head of a copy of the global model on virtual features (USCC / CCVR)."""
        model = self.spare("calibration", sim.model)
        model.load_state_dict(sim.global_state)
        d = sim.data  # each client's statistics under the current global encoder
        merged = merge_class_stats([
            encoded_class_stats(model.encoder, d.x, d.y, split.train, d.num_classes, with_cov=True)
            for split in d.clients])
        gen = torch.Generator().manual_seed(derived_seed(self.exp.seed, completed, 0xCCF))
        feats, labels = sample_virtual_features(merged, self.params.M, gen)
        train_head(model.head, feats, labels, CALIB_LR, CALIB_BATCH, gen, epochs=self.params.calib_epochs,
                   momentum=self.params.calib_momentum)
        return clone_state(model)

    def load_global(self, model: SplitModel, global_state: StateDict) -> None:
        model.load_state_dict(self.calibrated if self.calibrated is not None else global_state)

    def load_personal(self, model: SplitModel, global_state: StateDict, client_state: dict) -> None:
        self.load_global(model, global_state)

    def server_state(self) -> dict[str, Any]:
        return {"prototypes": self.prototypes, "has_prototype": self.has_prototype,
                "calibrated": self.calibrated, "calibrated_round": self.calibrated_round}

    def load_server_state(self, state: dict[str, Any]) -> None:
        self.prototypes, self.has_prototype = state["prototypes"], state["has_prototype"]
        self.calibrated, self.calibrated_round = state["calibrated"], state["calibrated_round"]

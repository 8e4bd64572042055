"""DualFed (spec §5): shared encoder f and global head h_g; private projector g, personal head h_p
and BN statistics. Stage 1 trains f, g, h_p with CE + lambda * SupCon; stage 2 trains only h_g.
Prediction sums the raw logits of both heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict, weighted_average
from autofl.losses import supcon
from autofl.methods.base import Method, MethodParams, ModelCopies, ServerState, Sharing, Stage, Update, Upload
from autofl.methods.registry import register
from autofl.models.parts import SplitModel, build_head

_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


class DualFedParams(MethodParams):
    lam: float = Field(2.0, ge=0, description="lambda: weight of SupCon", json_schema_extra=FUSIBLE)
    tau: float = Field(0.05, gt=0, description="SupCon temperature", json_schema_extra=FUSIBLE)
    weighted: bool = Field(False, description="size-weighted aggregation (the official code weights equally)")


@register
class DualFed(Method):
    name = "dualfed"
    # encoder and global head are aggregated; the encoder's BN statistics are averaged only for the
    # global model's evaluation and never overwrite a client's own
    sharing = Sharing(local=("projector.*", "head.*"), also_kept=tuple(f"encoder.*.{b}" for b in _BN_BUFFERS))
    Params = DualFedParams
    params: DualFedParams  # the validated Params (Method.__init__)
    uses_projector = True
    default_projector_depth = 2
    min_projector_depth = 1
    personal_is_global = False
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

    def build_model(self) -> SplitModel:
        model = super().build_model()
        model.global_head = build_head(self.exp.model, self.input_shape, self.num_classes)
        return model

    def aggregate(self, uploads: list[Upload]) -> StateDict:
        weights = [u.num_samples if self.params.weighted else 1.0 for u in uploads]
        return weighted_average([u.state for u in uploads], weights)

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        def stage1_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            """CE(h_p(g(f(x)))) + lambda * SupCon(normalize(g(f(x))))."""
            z = ws.model.projector(ws.model.encoder(x))
            return F.cross_entropy(ws.model.head(z), y) + self.fused(flags, "lam") * supcon(
                F.normalize(z, dim=1), y, self.fused(flags, "tau")
            )

        def stage2_loss(ws: ModelCopies, f: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            """CE(h_g(f)) on the features f = f(x) (the stage's `inputs`: f's weights fixed, no
            gradient). The model stays in train mode, as in the official code (its stage 2 runs the
            whole model's training forward): an f with BatchNorm normalises with batch statistics, and
            f's and g's BatchNorm running statistics keep moving."""
            with torch.no_grad():
                ws.model.projector(f)  # the official forward runs g too: its running statistics move
            return F.cross_entropy(ws.model.global_head(f), y)

        return [
            Stage((Update(("model.encoder.", "model.projector.", "model.head."), stage1_loss),)),
            Stage((Update(("model.global_head.",), stage2_loss, report="stage2_loss"),), inputs="model.encoder"),
        ]

    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict, server: ServerState) -> torch.Tensor:
        f = model.encoder(x)
        return model.head(model.projector(f)) + model.global_head(f)

    def predict_global(self, model: SplitModel, x: torch.Tensor, server: ServerState) -> torch.Tensor:
        return model.global_head(model.encoder(x))

"""Ditto (Li et al., ICML'21; spec §2): the global model w is trained by FedAvg; each client also
keeps a personal model v, trained on CE(v(x), y) + lambda/2 * ||v - sg(w_global)||^2, w_global the
model the client received this round. Only w is uploaded; personal metrics use v.

By default v takes as many steps as w, on the same batches: per batch, a step of w, then one of v
(FLGo's Ditto, the FDCL paper's baseline). With `personal_epochs` set, v first trains alone for
that many epochs, then w for fl.local_epochs (PFLlib's Ditto: `plocal_epochs`).

The personal model is a private model (`private_models`): a second copy of the layout kept inside
the client's model (`personal.*`), private to the client, starting as the received global model
before the client's first participation; `glob` is the received global model, frozen: the proximal
anchor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict
from autofl.methods.base import ClientStart, Method, MethodParams, ModelCopies, ServerState, Stage, Update
from autofl.methods.registry import register
from autofl.models.parts import SplitModel

_PERSONAL = "personal."
_GLOBAL_PARTS = ("model.encoder.", "model.projector.", "model.head.")


class DittoParams(MethodParams):
    lam: float = Field(
        0.1,
        ge=0,
        description="lambda: weight of the personal model's proximal term to the received global model",
        json_schema_extra=FUSIBLE,
    )
    personal_epochs: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="epochs of the personal model per "
        "round, trained before w; None: v steps with w on the same batches",
    )


@register
class Ditto(Method):
    name = "ditto"
    Params = DittoParams
    params: DittoParams  # the validated Params (Method.__init__)
    private_models = ("personal",)  # v: each client's own, starting as the received global model
    copies = ("glob",)  # the received global model: the personal model's proximal anchor
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

    def client_start(self, global_state: StateDict, client_state: dict[str, Any], server: ServerState) -> ClientStart:
        return ClientStart({"model": self.start_state(global_state, client_state), "glob": global_state})

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """w on CE (FedAvg) and v on its proximal CE (reported as `personal_loss`): per batch, w then
        v; or, with personal_epochs, v alone for that many epochs, then w (each its own batch order
        and optimizer)."""

        def personal_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            v = ws.model.personal
            anchor = {k: p.detach() for k, p in ws.glob.named_parameters() if not k.startswith(_PERSONAL)}
            return F.cross_entropy(v(x), y) + self.fused(flags, "lam") / 2 * ws.proximal(
                dict(v.named_parameters()), anchor
            )

        def global_loss(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
            return F.cross_entropy(ws.model(x), y)

        personal = Update(("model." + _PERSONAL,), personal_loss, report="personal_loss")
        fedavg = Update(_GLOBAL_PARTS, global_loss)
        if self.params.personal_epochs is None:
            return [Stage((fedavg, personal))]
        return [Stage((personal,), epochs=self.params.personal_epochs), Stage((fedavg,))]

    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict, server: ServerState) -> torch.Tensor:
        return model.personal(x)

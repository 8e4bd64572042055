"""FedRep (Collins et al., ICML'21; spec §2): the encoder (the representation) is shared, the head
stays private. Each round a client first trains its head alone for `head_epochs` epochs with the
received encoder frozen, then the encoder alone for `fl.local_epochs` epochs with its new head
frozen. The personal model is the global encoder with the client's own head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from autofl.methods.base import Method, MethodParams, ModelCopies, ServerState, Sharing, Stage, Update
from autofl.methods.registry import register

_BODY = ("model.encoder.", "model.projector.")


class FedRepParams(MethodParams):
    head_epochs: int = Field(
        10,
        ge=1,
        le=1000,
        description="epochs of head-only training before the encoder's "
        "fl.local_epochs (the paper: 10 head epochs, 1 for the representation)",
    )


@register
class FedRep(Method):
    name = "fedrep"
    sharing = Sharing(local=("head.*",))  # the head stays on its client
    Params = FedRepParams
    params: FedRepParams  # the validated Params (Method.__init__)
    has_global_model = False  # the server never trains a head
    personal_is_global = False
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """Head alone (encoder frozen) for head_epochs, then the encoder alone (head frozen) for
        fl.local_epochs; both on CE, each stage with a fresh optimizer. The head stage's loss is
        reported as `head_loss`, the encoder stage's as the round's `loss`."""
        if not self.layout.trains("encoder."):  # the head takes every layer
            return [Stage((Update(("model.head.",), self.loss),), epochs=self.params.head_epochs)]
        # the head's epochs read the frozen encoder's outputs (the stage's inputs): computed once a round
        head = Stage(
            (Update(("model.head.",), head_loss, report="head_loss"),),
            epochs=self.params.head_epochs,
            inputs="model.encoder",
        )
        return [head, Stage((Update(_BODY, self.loss),))]


def head_loss(ws: ModelCopies, f: torch.Tensor, y: torch.Tensor, flags: dict) -> torch.Tensor:
    """CE of the model's prediction from the encoder's outputs f (the rest of `SplitModel.forward`)."""
    return F.cross_entropy(ws.model.head(ws.model.projector(f)), y)

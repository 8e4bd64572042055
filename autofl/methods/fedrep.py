"""FedRep (Collins et al., ICML'21; spec §2): the encoder (the representation) is shared, the head
stays private. Each round a client first trains its head alone for `head_epochs` epochs with the
received encoder frozen, then the encoder alone for `fl.local_epochs` epochs with its new head
frozen. The personal model is the global encoder with the client's own head.
"""

from __future__ import annotations

from pydantic import Field

from autofl.methods.base import Method, MethodParams, ServerState, Stage, Update
from autofl.methods.registry import register
from autofl.models.parts import SplitModel

_BODY = ("model.encoder.", "model.projector.")


class FedRepParams(MethodParams):
    head_epochs: int = Field(10, ge=1, le=1000, description="epochs of head-only training before the encoder's "
                             "fl.local_epochs (the paper: 10 head epochs, 1 for the representation)")


@register
class FedRep(Method):
    name = "fedrep"
    Params = FedRepParams
    has_global_model = False  # the server never trains a head
    personal_is_global = False

    def build_model(self) -> SplitModel:
        model = super().build_model()
        self.has_body = any(True for _ in model.encoder.parameters())  # none when the head takes every layer
        return model

    def shared_keys(self, model: SplitModel) -> list[str]:
        return [k for k in model.state_dict() if not k.startswith("head.")]

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """Head alone (encoder frozen) for head_epochs, then the encoder alone (head frozen) for
        fl.local_epochs; both on CE, each stage with a fresh optimizer. The head stage's loss is
        reported as `head_loss`, the encoder stage's as the round's `loss`."""
        head = Update(("model.head.",), self.loss, report="head_loss" if self.has_body else "loss")
        stages = [Stage((head,), epochs=self.params.head_epochs)]
        if self.has_body:
            stages.append(Stage((Update(_BODY, self.loss),)))
        return stages

"""FedGH (Yi et al., ACM MM'23; spec §2): each client keeps its own encoder; one global head is
trained on the server. A client starts a round from its own encoder with the global head, trains
the whole model with CE, and uploads its per-class mean encoder features; the server trains the
global head on those (class mean, class) pairs with CE for `server_epochs` epochs of SGD at
`server_lr` (batch fl.batch_size, as PFLlib), and every client uses the new head from then on.
Personal model = the client's own encoder + the global head.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from autofl.config import FUSIBLE
from autofl.engine.state import StateDict
from autofl.features import ClassStats, class_mean_pairs, encoded_class_stats, train_head
from autofl.methods.base import Method, MethodParams, ServerContext, ServerUpdate, Sharing, TrainedClient, Upload
from autofl.methods.registry import register

_HEAD = "head."


# the seed stream of the server's batch order when it trains the global head: a number kept from before streams
# were named by strings, so that runs reproduce (a new method names its streams: ctx.generator("..."))
GLOBAL_HEAD_STREAM = 0xF6E


class FedGHParams(MethodParams):
    server_lr: float = Field(
        0.01, gt=0, description="learning rate of the server's SGD on the global head", json_schema_extra=FUSIBLE
    )
    server_epochs: int = Field(1, ge=1, le=1000, description="epochs over the uploaded class means per round")


def train_global_head(
    head: torch.nn.Module, local: list[ClassStats], lr: float, epochs: int, batch_size: int, generator: torch.Generator
) -> StateDict:
    """The server step: plain SGD of `head` (loaded with the current global head) with CE on every
    uploaded (class mean, class) pair, shuffled each epoch; returns the new head's state."""
    feats, labels = class_mean_pairs(local)
    train_head(head, feats, labels, lr, batch_size, generator, epochs=epochs)
    return {k: v.detach().clone() for k, v in head.state_dict().items()}


@register
class FedGH(Method):
    name = "fedgh"
    # only class means go up; the global head is trained on the server, and every sampled client
    # downloads it and starts from it
    sharing = Sharing(local=("*",), server_trained=(_HEAD + "*",))
    Params = FedGHParams
    params: FedGHParams  # the validated Params (Method.__init__)
    has_global_model = False  # the encoders stay on the clients: no whole global model
    personal_is_global = False
    population_ready = True  # its local step is FedAvg's; server_lr acts on the server alone
    same_steps_every_round = True  # round and server state reach its losses only as flags

    # ----- server ----------------------------------------------------------------------------
    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate:
        """The global head (the `head.*` entries of the global state) trained on this round's uploads."""
        head = self.spare("global_head", ctx.model.head)
        head.load_state_dict({k[len(_HEAD) :]: v for k, v in ctx.global_state.items() if k.startswith(_HEAD)})
        new = train_global_head(
            head,
            [u.payload["protos"] for u in uploads],
            self.params.server_lr,
            self.params.server_epochs,
            self.exp.fl.batch_size,
            ctx.generator(GLOBAL_HEAD_STREAM),
        )
        return ServerUpdate(global_state={_HEAD + k: v for k, v in new.items()})

    # ----- client ----------------------------------------------------------------------------
    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        return {
            "protos": encoded_class_stats(
                client.model.encoder, client.x, client.y, client.train_idx, client.num_classes
            )
        }

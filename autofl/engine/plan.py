"""The step language: what a method declares and the executors run.

A method declares its local step as `Stage`s of `Update`s and says where each client starts
(`ClientStart`); the executors in this package interpret that declaration one client at a time or
all sampled clients at once. After training, the engine hands the method each `TrainedClient`
and collects `Upload`s for the server. These are plain values: the engine defines them, methods
import them, and nothing here knows any method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from autofl.engine.state import StateDict
from autofl.errors import MethodDefinitionError
from autofl.models.parts import SplitModel


class ModelCopies(Protocol):
    """A loss's `ws` as a type checker sees it: `ws.model` and the method's named copies, each a
    `SplitModel` (at run time the workspace module, autofl.engine.executor.Workspace)."""

    def __getattr__(self, name: str) -> SplitModel: ...


# loss(ws, x, y, flags): ws is the workspace module (ws.model and the method's named copies),
# flags maps names to per-client scalar tensors
LossFn = Callable[[ModelCopies, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Update:
    """One optimizer step per batch: the tensors it trains and the loss they minimise.

    `trains` are name prefixes in the workspace (`"model."`, `"model.encoder."`, `"siamese."`);
    each update has its own SGD optimizer, new at the start of its stage. The models it trains
    run in train mode, the others in eval mode; BatchNorm layers under `frozen_stats`
    normalise with batch statistics but leave their running statistics alone (for a forward
    that repeats one an earlier update already counted on this batch).
    """

    trains: tuple[str, ...]
    loss: LossFn
    report: str | None = "loss"  # the client's mean of this loss is reported under this name
    frozen_stats: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stage:
    """`epochs` passes over the client's batches (None: fl.local_epochs), running `updates` in
    order on every batch. After each epoch, `snapshot_after_epoch` copies whole models
    (target <- source, e.g. {"hist": "model"}) and `flags_after_epoch` sets per-client flags.

    `inputs` names a workspace module (e.g. "model.encoder") that the stage only reads: no update
    of the stage trains it and no snapshot writes it. The stage's losses then get that module's
    output on the batch, computed without gradients, in place of the batch itself (DualFed's
    stage 2 trains a head on the frozen encoder's features). The executors compute it once per
    client for the whole stage, over all of the client's samples, when every layer of the module
    maps each sample on its own (`executor.PER_SAMPLE_LAYERS`: Linear, convolutions, pooling,
    activations); otherwise (a BatchNorm normalising with the batch's statistics, a layer they do
    not know) batch by batch, inside each step, in the mode the stage's updates set."""

    updates: tuple[Update, ...]
    epochs: int | None = None
    snapshot_after_epoch: dict[str, str] = field(default_factory=dict)
    flags_after_epoch: dict[str, float] = field(default_factory=dict)
    inputs: str | None = None


def check_trained_copies(
    method: str, stages: list[Stage], copies: tuple[str, ...], scratch_copies: tuple[str, ...]
) -> None:
    """Raise one line when an update trains a workspace copy that nothing keeps: an executor returns
    the trained `model` alone, so a trained copy's weights are dropped at the end of the round. A
    copy may be trained only when the method declares it `scratch_copies` (rebuilt every round on
    purpose, as FedSiam-DA's f'); a model the client keeps is a private model inside `model`
    (`Method.private_models`), trained as `model.<name>.`. Every executor runs this plan, so the
    check is made once, here, before any client trains."""
    unknown = [c for c in scratch_copies if c not in copies]
    if unknown:
        raise MethodDefinitionError(
            f"method {method}: scratch_copies {unknown[0]!r} is not in copies {copies}; "
            "a scratch copy must also be listed in copies"
        )
    for stage in stages:
        for update in stage.updates:
            for prefix in update.trains:
                target = prefix.split(".", 1)[0]
                if target != "model" and target not in scratch_copies:
                    raise MethodDefinitionError(
                        f"method {method}: an Update trains workspace copy {target!r} (trains {prefix!r}), which "
                        f"nothing keeps, so its trained weights are dropped after every round; to keep it per "
                        f"client declare private_models = ({target!r},) and train 'model.{target}.', or, if it is "
                        f"rebuilt every round on purpose, declare scratch_copies = ({target!r},)"
                    )


@dataclass
class ClientStart:
    """What one client starts a round from: `models["model"]` is the state it trains; other
    entries fill the method's named copies (frozen unless an update trains them)."""

    models: dict[str, StateDict]
    # per-client values a loss reads from `flags`: numbers, or tensors of one shape for every client
    # (a server state the loss reads, e.g. FedFCD's GFRs, so that each config of a population has its own)
    flags: dict[str, float | torch.Tensor] = field(default_factory=dict)


def flag_tensor(value: float | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One client's flag as a loss reads it: a number or a floating tensor in the trained `dtype`; a tensor of
    another kind (a bool mask, indices) keeps its own."""
    if isinstance(value, torch.Tensor) and not value.is_floating_point():
        return value.to(device)
    return torch.as_tensor(value, dtype=dtype, device=device)


@dataclass
class Upload:
    cid: int
    num_samples: int
    state: StateDict  # the shared parameters after local training
    payload: dict[str, Any]
    loss: float


@dataclass
class TrainedClient:
    """A client after local training, its final state loaded into `model` (for upload payloads)."""

    cid: int
    round: int
    model: SplitModel
    x: torch.Tensor  # the pooled inputs; the client's rows are `train_idx`
    y: torch.Tensor
    train_idx: torch.Tensor
    num_classes: int

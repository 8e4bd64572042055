"""The method interface: the few hooks through which the FL engine runs any method.

The engine knows no method by name. A method is one module that subclasses `Method`, declares
its parameters as a pydantic model, and overrides only the hooks it changes. The defaults are
FedAvg: everything shared, plain cross-entropy SGD, size-weighted averaging, personal = global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn

from autofl.models.parts import SplitModel, build_model

if TYPE_CHECKING:
    from autofl.config import Experiment
    from autofl.engine.simulation import Simulation

StateDict = dict[str, torch.Tensor]


class MethodParams(BaseModel):
    """A method's own hyperparameters; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class LocalResult:
    num_samples: int
    loss: float
    payload: dict[str, Any] = field(default_factory=dict)  # extra uploads: prototypes, statistics


@dataclass
class Upload:
    cid: int
    num_samples: int
    state: StateDict  # the shared parameters after local training
    payload: dict[str, Any]
    loss: float


@dataclass
class ClientContext:
    """Everything one client sees in one round."""

    cid: int
    round: int
    model: SplitModel  # the working model, already loaded with this client's starting weights
    x: torch.Tensor  # the pooled inputs; the client's rows are `train_idx`
    y: torch.Tensor
    train_idx: torch.Tensor
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    local_epochs: int
    generator: torch.Generator  # fixes this client's batch order in this round
    state: dict[str, Any]  # this client's private state, kept across rounds
    global_state: StateDict  # the global model received this round
    num_classes: int

    @property
    def device(self) -> torch.device:
        return self.x.device

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One shuffled epoch over the client's train split, by index (a lone last sample is dropped)."""
        n = len(self.train_idx)
        order = self.train_idx[torch.randperm(n, generator=self.generator).to(self.train_idx.device)]
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            if len(idx) < 2 <= n:  # BatchNorm cannot train on one sample
                continue
            yield self.x[idx], self.y[idx]

    def optimizer(self, params: Any, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr if lr is None else lr, momentum=self.momentum,
                               weight_decay=self.weight_decay)


def frozen_copy_into(target: nn.Module, state: StateDict) -> nn.Module:
    """Load `state` into a spare model kept for the purpose, put it in eval mode, freeze it."""
    target.load_state_dict(state)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def clone_state(model: nn.Module, keys: list[str] | None = None) -> StateDict:
    state = model.state_dict()
    return {k: state[k].detach().clone() for k in (keys if keys is not None else state)}


def weighted_average(states: list[StateDict], weights: list[float]) -> StateDict:
    """sum_i w_i * state_i per key, with the weights normalised; integer buffers are rounded back."""
    total = float(sum(weights))
    norm = torch.tensor([w / total for w in weights], dtype=torch.float64)
    out: StateDict = {}
    for key in states[0]:
        stacked = torch.stack([s[key].to(torch.float64) for s in states])
        mean = torch.tensordot(norm.to(stacked.device), stacked, dims=1)
        ref = states[0][key]
        out[key] = (mean.round() if not ref.is_floating_point() else mean).to(ref.dtype)
    return out


class Method:
    """Defaults implement FedAvg; subclasses override the hooks they change."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[MethodParams]] = MethodParams
    uses_projector: ClassVar[bool] = False  # whether model.projector_depth / projector_dim apply
    default_projector_depth: ClassVar[int] = 0
    min_projector_depth: ClassVar[int] = 0
    has_global_model: ClassVar[bool] = True  # whether global_* metrics are defined
    personal_is_global: ClassVar[bool] = True  # personal model = global model
    # per training sample and local epoch, for the benchmark's compute floor: forward+backward passes of
    # a model, and extra forwards without gradient (frozen global / previous copies)
    train_passes: ClassVar[int] = 1
    extra_forwards: ClassVar[int] = 0

    def __init__(self, params: MethodParams, exp: "Experiment", input_shape: tuple[int, ...], num_classes: int):
        self.params = params
        self.exp = exp
        self.input_shape = input_shape
        self.num_classes = num_classes
        self._spares: dict[str, SplitModel] = {}

    # ----- model -----------------------------------------------------------------------------
    def build_model(self) -> SplitModel:
        return build_model(self.exp.model, self.input_shape, self.num_classes)

    def spare(self, name: str, like: nn.Module) -> SplitModel:
        """A second model instance of the same layout, built once and reused by loading states."""
        if name not in self._spares:
            import copy

            self._spares[name] = copy.deepcopy(like)
        return self._spares[name]

    def shared_keys(self, model: SplitModel) -> list[str]:
        """State-dict keys the server aggregates; the rest stay on the client."""
        return list(model.state_dict())

    # ----- server ----------------------------------------------------------------------------
    def setup(self, sim: "Simulation") -> None:
        """Called once before round 0 (e.g. initial prototypes)."""

    def aggregate(self, uploads: list[Upload]) -> StateDict:
        return weighted_average([u.state for u in uploads], [u.num_samples for u in uploads])

    def server_update(self, sim: "Simulation", uploads: list[Upload]) -> None:
        """Called after aggregation, with the global state already updated."""

    def server_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the method's server-side state."""
        return {}

    def load_server_state(self, state: dict[str, Any]) -> None:
        del state

    # ----- client ----------------------------------------------------------------------------
    def load_client(self, model: SplitModel, global_state: StateDict, client_state: dict[str, Any]) -> None:
        """The client's starting weights: the global model, overlaid with its private parameters."""
        model.load_state_dict(global_state)
        private = client_state.get("private")
        if private:
            model.load_state_dict(private, strict=False)

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(ctx.model(x), y)

    def local_train(self, ctx: ClientContext) -> LocalResult:
        return sgd_epochs(ctx, ctx.model.parameters(), ctx.local_epochs, lambda x, y: self.loss(ctx, x, y))

    def keep_private(self, ctx: ClientContext, shared: list[str]) -> None:
        """After local training: store what stays on the client."""
        private = [k for k in ctx.model.state_dict() if k not in set(shared)]
        if private:
            ctx.state["private"] = clone_state(ctx.model, private)

    # ----- evaluation ------------------------------------------------------------------------
    def load_personal(self, model: SplitModel, global_state: StateDict, client_state: dict[str, Any]) -> None:
        self.load_client(model, global_state, client_state)

    def predict(self, model: SplitModel, x: torch.Tensor, client_state: dict[str, Any]) -> torch.Tensor:
        """Logits of a client's personal model (already loaded into `model`)."""
        return model(x)

    def load_global(self, model: SplitModel, global_state: StateDict) -> None:
        model.load_state_dict(global_state)

    def predict_global(self, model: SplitModel, x: torch.Tensor) -> torch.Tensor:
        return model(x)


def sgd_epochs(ctx: ClientContext, params: Any, epochs: int, loss_fn: Any, lr: float | None = None) -> LocalResult:
    """Plain local SGD: `epochs` passes over the client's batches minimising `loss_fn(x, y)`."""
    ctx.model.train()
    opt = ctx.optimizer(params, lr)
    meter = LossMeter(ctx.device)
    for _ in range(epochs):
        for x, y in ctx.batches():
            loss = loss_fn(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            meter.add(loss, len(y))
    return LocalResult(num_samples=len(ctx.train_idx), loss=meter.mean())


class LossMeter:
    """Sample-weighted mean loss, accumulated on the device (no host sync per batch)."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), device=device)
        self.count = 0

    def add(self, loss: torch.Tensor, n: int) -> None:
        self.total += loss.detach() * n
        self.count += n

    def mean(self) -> float:
        return float(self.total) / max(self.count, 1)

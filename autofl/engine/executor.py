"""The executor seam: how a round's sampled clients run a method's declared local step.

An executor gets the round's `RoundPlan` (the method's stages and the SGD settings) and one
`ClientJob` per sampled client, and returns each client's trained model state and mean losses.
Both executors draw every client's batch order from the same per-client generator with
`epoch_orders` and cut it with `batch_cuts`, so a client sees the same batches, in the same order, under either.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch
from torch import nn

from autofl import losses
from autofl.engine.plan import ClientStart, LossFn, ModelCopies, Stage, Update
from autofl.engine.state import StateDict

if TYPE_CHECKING:
    from autofl.models.parts import SplitModel

BatchNorm: TypeAlias = nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d


@dataclass
class RoundPlan:
    stages: list[Stage]
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    local_epochs: int
    # told how many more clients finished training (a progress display); executors call it as
    # clients finish: one at a time (sequential) or a chunk at once (vectorized)
    clients_done: Callable[[int], None] | None = None

    def finished(self, clients: int) -> None:
        if self.clients_done is not None:
            self.clients_done(clients)

    def optimizer(self, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def epochs(self, stage: Stage) -> int:
        return stage.epochs if stage.epochs is not None else self.local_epochs


@dataclass
class ClientJob:
    cid: int
    start: ClientStart
    train_idx: torch.Tensor  # rows of the pooled data
    generator: torch.Generator  # this client's batch order in this round


@dataclass
class ClientOutcome:
    state: StateDict  # the trained model's state (the client's own tensors)
    losses: dict[str, float]  # sample-weighted mean of each reported loss


class Executor(Protocol):
    name: str

    def train(self, plan: RoundPlan, jobs: list[ClientJob], x: torch.Tensor, y: torch.Tensor) -> list[ClientOutcome]:
        """Train every job; outcomes in the order of `jobs`."""
        ...


@functools.lru_cache(maxsize=4096)
def batch_cuts(n: int, batch_size: int) -> tuple[tuple[int, int], ...]:
    """(start, end) of each batch of an n-sample epoch; a lone last sample is dropped (BatchNorm
    cannot train on one sample) unless it is the client's only sample. Cached: a client's cuts are
    the same every round (executors ask for every sampled client's each round)."""
    cuts = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    return tuple((a, b) for a, b in cuts if not (b - a < 2 <= n))


def epoch_orders(job: ClientJob, plan: RoundPlan) -> list[list[torch.Tensor]]:
    """For each stage, for each of its epochs, the client's shuffled train rows (one randperm per
    epoch, drawn in stage then epoch order from the client's generator)."""
    n = len(job.train_idx)
    orders = []
    for stage in plan.stages:
        per_epoch = []
        for _ in range(plan.epochs(stage)):
            perm = torch.randperm(n, generator=job.generator).to(job.train_idx.device)
            per_epoch.append(job.train_idx[perm])
        orders.append(per_epoch)
    return orders


def stage_models(stage: Stage) -> set[str]:
    """Top-level workspace models some update of the stage trains (they run in train mode)."""
    return {prefix.split(".", 1)[0] for update in stage.updates for prefix in update.trains}


# layers whose output for a sample depends on that sample alone, in train mode as in eval mode: a
# stage's `inputs` module made only of these is computed once per client for the whole stage (exact
# types: a subclass may override forward)
PER_SAMPLE_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Sequential,
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.Softplus,
    nn.Hardswish,
    nn.LayerNorm,
    nn.GroupNorm,
)


def stage_inputs(ws: Workspace, stage: Stage) -> nn.Module | None:
    """The module named by `stage.inputs` when an executor may compute its outputs once per client for
    the whole stage (every layer in `PER_SAMPLE_LAYERS`); None when the stage declares none, or when
    its losses must compute it batch by batch (`losses_on_inputs`)."""
    if stage.inputs is None:
        return None
    trained = ws.param_names(tuple(p for update in stage.updates for p in update.trains))
    if (
        any(n.startswith(stage.inputs + ".") for n in trained)
        or stage.inputs.split(".", 1)[0] in stage.snapshot_after_epoch
    ):
        raise ValueError(
            f"Stage.inputs {stage.inputs!r}: the stage trains or overwrites it; "
            "it must be a module the stage only reads"
        )
    module = ws.get_submodule(stage.inputs)
    return module if all(_per_sample(m) for m in module.modules()) else None


def _per_sample(layer: nn.Module) -> bool:
    if type(layer) not in PER_SAMPLE_LAYERS:
        return False
    # a flatten or unflatten that reaches the batch dimension mixes samples
    if isinstance(layer, nn.Flatten):
        return layer.start_dim >= 1
    if isinstance(layer, nn.Unflatten):
        return isinstance(layer.dim, int) and layer.dim >= 1
    return True


# rows a stage's `inputs` module is computed on in one call: its activations, not the client's
# whole data, bound the memory this takes
INPUTS_SLICE = 1024


def outputs_by_slices(
    module: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """`module(x[rows])` without gradients, computed on slices of `INPUTS_SLICE` rows, each written into
    the result as it is made. The rows are gathered by `index_select` (the same values as `x[rows]`,
    several times faster on CPU: 55 us against 320 us for 1,024 Fashion-MNIST rows)."""
    with torch.no_grad():
        if not len(rows):  # a client without training rows: no outputs, in the module's output shape
            return module(x[:0])
        out: torch.Tensor | None = None
        for i in range(0, len(rows), INPUTS_SLICE):
            part = module(torch.index_select(x, 0, rows[i : i + INPUTS_SLICE]))
            if out is None:
                out = part.new_empty(len(rows), *part.shape[1:])
            out[i : i + len(part)] = part
    assert out is not None  # rows is not empty
    return out


def losses_on_inputs(stage: Stage) -> Stage:
    """`stage` with each loss computing the stage's `inputs` module on its batch first (without
    gradients): how a stage runs whose inputs are not computed ahead (`stage_inputs`)."""
    if stage.inputs is None:
        return stage
    return dataclasses.replace(
        stage,
        inputs=None,
        updates=tuple(
            dataclasses.replace(u, loss=_loss_on_module_outputs(stage.inputs, u.loss)) for u in stage.updates
        ),
    )


def _loss_on_module_outputs(name: str, loss: LossFn) -> LossFn:
    path = name.split(".")

    def on_outputs(ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict[str, torch.Tensor]) -> torch.Tensor:
        module: Any = ws
        for part in path:
            module = getattr(module, part)
        with torch.no_grad():
            x = module(x)
        return loss(ws, x, y, flags)

    on_outputs.computes_inputs_of = (name, loss)  # type: ignore[attr-defined]  # what it wraps, for executors
    return on_outputs


class Workspace(nn.Module):
    """The modules a method's loss sees: `ws.model` plus the method's named copies, each a model
    of the same layout. Calling it runs a loss: `ws(x, y, flags, loss)` = `loss(ws, x, y, flags)`,
    which is what `torch.func.functional_call` needs to run the loss on substituted tensors."""

    def __init__(self, model: nn.Module, copies: tuple[str, ...]):
        super().__init__()
        self.model = model
        for name in copies:
            self.add_module(name, copy.deepcopy(model))
        self._mode_key: Any = None
        self._frozen_bn: list[BatchNorm] = []
        self._frozen_by_names: dict[Any, list[BatchNorm]] = {}  # update.frozen_stats -> its BatchNorm modules
        # a compiled step's key -> one client's step size (the vectorized executor's steps per call)
        self.client_step_sizes: dict[Any, Any] = {}
        # how `proximal` computes each term: None, plainly; an executor that applies proximal terms' steps
        # itself sets a function (p, anchor, distance) -> term (autofl.accel.linear_probes.LinearProbes.term)
        self.term_probe: Callable[..., torch.Tensor] | None = None

    if TYPE_CHECKING:  # for type checkers: the attributes not declared here are the model copies

        def __getattr__(self, name: str) -> SplitModel: ...

    def forward(self, x: torch.Tensor, y: torch.Tensor, flags: dict[str, torch.Tensor], loss: Any) -> torch.Tensor:
        return loss(self, x, y, flags)

    def proximal(self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor]) -> torch.Tensor:
        """sum ||w - w_anchor||^2 over the named parameters (`autofl.losses.proximal`'s value), a term the
        loss declares to the executor: one that applies proximal steps itself (the compiled whole step,
        autofl.accel.linear_probes) gets each term through `term_probe`."""
        probe = self.term_probe
        if probe is None:
            terms = (losses.squared_distance(p, anchor[name]) for name, p in params.items())
        else:
            terms = (probe(p, anchor[name], losses.squared_distance) for name, p in params.items())
        return sum(terms)  # type: ignore[return-value]

    def model_names(self) -> list[str]:
        return [name for name, _ in self.named_children()]

    def param_names(self, prefixes: tuple[str, ...]) -> list[str]:
        return [name for name, _ in self.named_parameters() if name.startswith(prefixes)]

    def enter(self, trained_models: set[str], update: Update) -> None:
        """Set train / eval modes for one update (cached: nothing to do when unchanged)."""
        key = (frozenset(trained_models), update.frozen_stats)
        if key == self._mode_key:
            return
        self.leave()
        for name, module in self.named_children():
            # train() walks every submodule: only where the mode changes (a method alternating two
            # updates every step, as FedSiam-DA does, enters twice a step)
            if module.training != (name in trained_models):
                module.train(name in trained_models)
        self._frozen_bn = list(self.frozen_batchnorms(update.frozen_stats))
        for module in self._frozen_bn:
            module.track_running_stats = False
        self._mode_key = key

    @property
    def mode_key(self) -> Any:
        """What identifies the train / eval modes `enter` last set (None: none yet, or left)."""
        return self._mode_key

    def frozen_batchnorms(self, frozen_stats: tuple[str, ...]) -> list[BatchNorm]:
        """The BatchNorm modules under `frozen_stats` whose running statistics an update leaves alone
        (cached per tuple of names; read before `enter` changes any of them)."""
        if frozen_stats not in self._frozen_by_names:
            self._frozen_by_names[frozen_stats] = [
                module
                for name in frozen_stats
                for module in self.get_submodule(name).modules()
                if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)) and module.track_running_stats
            ]
        return self._frozen_by_names[frozen_stats]

    def frozen_buffer_names(self, frozen_stats: tuple[str, ...]) -> tuple[str, ...]:
        """The workspace names of the running-statistics buffers `frozen_stats` freezes (what an
        update in those modes must not write: running mean, variance and batch count)."""
        frozen = {id(m) for m in self.frozen_batchnorms(frozen_stats)}
        return tuple(
            f"{name}.{b}"
            for name, m in self.named_modules()
            if id(m) in frozen
            for b, _ in m.named_buffers(recurse=False)
        )

    def leave(self) -> None:
        for module in self._frozen_bn:
            module.track_running_stats = True
        self._frozen_bn = []
        self._mode_key = None

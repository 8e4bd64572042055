"""What the vectorized executor keeps from one round to the next when whole steps replay as CUDA graphs.

A CUDA graph replays kernels on the memory it was captured on (accel/cuda_graphs.py), so a graph is
keyed by the identity of the tensors its step reads. Each round used to stack new tensors, make new
optimizers and new `StepGraphs`, so every round paid each step's eager warm-up and its capture again,
and ran eagerly the steps where some clients have shorter last batches (a one-epoch stage meets each
such pattern once a round): on an H200 each of those is an eager `vmap(grad)` call of some 2.5 ms,
nine of them in a fedfcd-t1 FedAvg round whose replays take about 0.1 ms a step.

`RoundArena` holds, for the chunks of K clients (`runtime.client_chunk`; one chunk of all sampled clients
by default), the tensors a round's steps read and write, in place:
- the stacked (and the shared, unstacked) workspace tensors, and the row-0 views of received
  parameters (`stacked`, `row_view`): a new round's starting values are copied into the same tensors;
- the per-client flags (`flag`) and a stage's table of computed inputs (`table`), likewise;
- each update's SGD optimizer (`optimizer`): reused over the same tensors with the new round's settings
  (a learning rate decayed by fl.lr_decay) and its momentum buffers zeroed (exactly a fresh SGD's first
  step when dampening is 0: 0 * momentum + d_p is d_p, the value a fresh optimizer clones);
- each update's `StepGraphs` (`graphs`), so a round's steps find the graphs of the rounds before;
- the patterns of shorter last batches each chunk's updates met last round (`seen`), which get graphs of
  their own from their next occurrence on when the loss and the optimizer's settings are the same
  (`_ChunkRun._graphed_runs`).

A round's chunks of one size share it: they run one after another, and a chunk's results are copied
out before the next starts, so one set of tensors and graphs serves them all.

When anything differs (a tensor's shape, a flag's size, another optimizer), the new round's own
object is kept instead and the graphs key on it anew: reusing is an optimisation, never a condition
of being right. A loss is keyed by what it is (`loss_holds`): the same function, the same closure made
again over the same values, the same method's bound `loss` finds its graphs again. A closure over a
round's own tensors (FedProto's and FedECCR's prototypes, FedFCD's GFR statistics) is run as a kept
closure of the same code whose cells hold the arena's copies of those tensors (`loss`), this round's
values copied in, so it finds its graphs again too.
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable, Hashable
from typing import Any

import torch

from autofl.accel import cuda_graphs


class RoundArena:
    """The tensors, optimizers and step graphs of a round's chunks of K clients, kept across rounds (module doc)."""

    def __init__(self) -> None:
        self.tensors: dict[tuple[str, bool], torch.Tensor] = {}
        self.views: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (base, its row 0)
        self.flags: dict[str, torch.Tensor] = {}
        self.tables: dict[int, torch.Tensor] = {}
        self.optimizers: dict[Hashable, torch.optim.Optimizer] = {}
        self.step_graphs: dict[Hashable, cuda_graphs.StepGraphs] = {}
        self.losses: dict[Hashable, tuple[types.FunctionType, list[Any]]] = {}  # `loss`: kept closures, their cells
        # (chunk, stage, update) -> its loss's `loss_holds`, its optimizer's settings and the patterns of
        # runs it met last round
        self.seen: dict[tuple[int, int, int], tuple[tuple[Any, ...], tuple[Any, ...], set[Any]]] = {}

    def stacked(self, name: str, batched: bool, value: torch.Tensor) -> torch.Tensor:
        """`value` (a round's stacked tensor, or a shared one) in the tensor kept under its name, when
        the kept one has its shape, dtype and device; otherwise a tensor of its own: `value` when it is a
        new stack, a copy of a shared one (the received global model's, which the arena must not write)."""
        return self._kept(self.tensors, (name, batched), value if batched else _Copy(value))

    def row_view(self, name: str, base: torch.Tensor) -> torch.Tensor:
        """`base[0]`, the same view object every round `base` is the same tensor."""
        kept = self.views.get(name)
        if kept is None or kept[0] is not base:
            kept = self.views[name] = (base, base[0])
        return kept[1]

    def flag(self, name: str, value: torch.Tensor) -> torch.Tensor:
        return self._kept(self.flags, name, value)

    def table(self, stage: int, value: torch.Tensor) -> torch.Tensor:
        return self._kept(self.tables, stage, value)

    def optimizer(self, key: Hashable, fresh: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer kept under `key`, reset to `fresh`'s settings (a new round's learning rate under
        fl.lr_decay, say) with its momentum zeroed, if it is an SGD over the same tensors and zeroing its
        momentum makes its next step a fresh one's; else `fresh`. Steps whose settings changed capture new
        graphs (the settings are part of a graph's key), but on the same optimizer and buffers."""
        kept = self.optimizers.get(key)
        if kept is not None and _resettable_sgd(kept, fresh):
            kept.param_groups[0].update({k: v for k, v in fresh.param_groups[0].items() if k != "params"})
            for state in kept.state.values():
                buf = state.get("momentum_buffer")
                if isinstance(buf, torch.Tensor):
                    buf.zero_()
            return kept
        self.optimizers[key] = fresh
        return fresh

    def loss(self, key: Hashable, loss: Callable[..., Any]) -> Callable[..., Any]:
        """The loss update `key`'s steps run: `loss`, or, for a closure over tensors (a round's prototypes,
        FedFCD's GFR statistics), a closure of the same code whose tensor cells hold the arena's own
        tensors. A later round's closure of the same code, over tensors of the same shapes and the same
        other values, gets that kept closure back with its tensors' values copied in, so its graphs
        replay on them; anything else gets a closure of its own (the tensors it closes over are never
        written)."""
        if not isinstance(loss, types.FunctionType) or not loss.__closure__:
            return loss
        try:
            cells = [cell.cell_contents for cell in loss.__closure__]
        except ValueError:  # a cell not filled yet
            return loss
        tensors = [i for i, v in enumerate(cells) if isinstance(v, torch.Tensor)]
        if not tensors or any(cells[i].requires_grad for i in tensors):
            return loss
        kept = self.losses.get(key)
        if kept is not None and _same_closure(kept[0], kept[1], loss, cells):
            with torch.no_grad():
                for i in tensors:
                    kept[1][i].copy_(cells[i])
            return kept[0]
        own = [v.detach().clone() if i in tensors else v for i, v in enumerate(cells)]
        rebound = types.FunctionType(
            loss.__code__, loss.__globals__, loss.__name__, loss.__defaults__, tuple(types.CellType(v) for v in own)
        )
        rebound.__kwdefaults__ = loss.__kwdefaults__
        rebound.__qualname__ = loss.__qualname__
        self.losses[key] = (rebound, own)
        return rebound

    def graphs(self, key: Hashable) -> cuda_graphs.StepGraphs:
        graphs = self.step_graphs.get(key)
        if graphs is None:
            graphs = self.step_graphs[key] = cuda_graphs.StepGraphs()
        return graphs

    @staticmethod
    def _kept(kept: dict[Any, torch.Tensor], key: Any, value: torch.Tensor | _Copy) -> torch.Tensor:
        """The tensor kept under `key`, holding `value` (copied in); a new one when shapes differ."""
        source = value.tensor if isinstance(value, _Copy) else value
        old = kept.get(key)
        if (
            old is not None
            and old.shape == source.shape
            and old.dtype == source.dtype
            and old.device == source.device
            and old.stride() == source.stride()
        ):
            with torch.no_grad():
                old.copy_(source)
            return old
        new = kept[key] = source.clone() if isinstance(value, _Copy) else source
        return new


class _Copy:
    """A tensor the arena must not keep itself (it belongs to someone else): it keeps a copy."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _resettable_sgd(kept: torch.optim.Optimizer, fresh: torch.optim.Optimizer) -> bool:
    if type(kept) is not torch.optim.SGD or type(fresh) is not torch.optim.SGD:
        return False
    if len(kept.param_groups) != 1 or len(fresh.param_groups) != 1:
        return False
    old, new = kept.param_groups[0], fresh.param_groups[0]
    if len(old["params"]) != len(new["params"]) or any(a is not b for a, b in zip(old["params"], new["params"])):
        return False
    return set(old) == set(new) and (new["momentum"] == 0 or new["dampening"] == 0)


def _same_closure(kept: types.FunctionType, kept_cells: list[Any], loss: types.FunctionType, cells: list[Any]) -> bool:
    """Whether `loss` is `kept` made again: the same code, globals and defaults, tensors of the same layout
    where `kept` holds its own, and the same values elsewhere (the same object, or an equal number or string)."""
    if (
        kept.__code__ is not loss.__code__
        or kept.__globals__ is not loss.__globals__
        or not _identical(kept.__defaults__ or (), loss.__defaults__ or ())
        or not _identical(tuple((kept.__kwdefaults__ or {}).items()), tuple((loss.__kwdefaults__ or {}).items()))
        or len(kept_cells) != len(cells)
    ):
        return False
    for old, new in zip(kept_cells, cells):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            if (
                old.shape != new.shape
                or old.dtype != new.dtype
                or old.device != new.device
                or old.stride() != new.stride()
            ):
                return False
        elif not (old is new or (type(old) is type(new) and type(new) in (int, float, bool, str) and old == new)):
            return False
    return True


def _identical(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(
        x is y or (isinstance(x, tuple) and isinstance(y, tuple) and _identical(x, y)) for x, y in zip(a, b)
    )


def loss_holds(loss: Callable[..., Any]) -> tuple[Any, ...]:
    """What identifies a loss for a step's graph key (`StepGraphs.run`'s `holds`), so that the same loss made
    again in a later round's `local_stages` finds its graphs: a function by its code and what it closes
    over (the contents of its cells, its defaults), a bound method by its object and its function, a
    `functools.partial` by its function and arguments, any other callable by itself; and each object
    among these (a cell's, an argument, the method's object) with what one level inside it holds: an
    object's attribute names and values, a module's parameters and buffers, a list's, tuple's or dict's
    items. A closure over a round's own tensors, or a method that replaces an attribute its loss reads
    (`self.prototypes = ...`), gets a new key and captures anew; tensors changed in place are read where
    they are, as any graph reads them. What a loss reads from elsewhere (a module's globals, tensors two
    levels down) must not be replaced between rounds: a kept graph would not see it (autofl/methods/base.py)."""
    # objects, not tuples made here: `holds` are keyed by identity and kept alive by the graph
    if isinstance(loss, functools.partial):
        return (
            functools.partial,
            *loss_holds(loss.func),
            *_inside(loss.args),
            *_inside(tuple(itertools.chain.from_iterable(loss.keywords.items()))),
        )
    if isinstance(loss, types.MethodType):
        return (*_inside((loss.__self__,)), *loss_holds(loss.__func__))
    if isinstance(loss, types.FunctionType):
        try:
            cells = tuple(cell.cell_contents for cell in loss.__closure__ or ())
        except ValueError:  # a cell not filled yet
            return (loss,)
        defaults = (*(loss.__defaults__ or ()), *itertools.chain.from_iterable((loss.__kwdefaults__ or {}).items()))
        return (loss.__code__, *_inside(cells), *_inside(defaults))
    return _inside((loss,))


def _inside(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`values`, each followed by what it holds one level down (`loss_holds`)."""
    out: list[Any] = []
    for value in values:
        out.append(value)
        if isinstance(value, torch.nn.Module):
            out.extend((*value.parameters(), *value.buffers()))
        elif isinstance(value, (list, tuple)):
            out.extend(value)
        elif isinstance(value, dict):
            out.extend(itertools.chain.from_iterable(value.items()))
        if not isinstance(value, (type, types.FunctionType, types.ModuleType, torch.Tensor, torch.nn.Module)):
            attributes = getattr(value, "__dict__", None)
            if isinstance(attributes, dict):
                out.extend(itertools.chain.from_iterable(attributes.items()))
    return tuple(out)

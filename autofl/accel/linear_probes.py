"""Linear layers' weight updates as one in-place product, for the compiled whole step on CPU.

In a batched SGD step on an MLP most of the time goes to the first linear layer's weight: autograd
forms each client's weight gradient dy^T x (a `bmm` into a new (K, out, in) tensor), and the update
then reads that gradient and the weight and writes the weight. `linear_sgd_` does both as one
`baddbmm_` into the weight, the gemm accumulating into its output (fedfcd-t1's first layer,
(20, 100, 784) stacked: 0.19 ms against 0.24 ms for the product and 0.08 ms for the update).

How the step gets dy and x for it: the workspace's `nn.Linear` modules carry a forward hook
(`LinearProbes`). While a probed step runs a loss with gradients enabled, a probed module's call
returns `F.linear(x, W.detach(), b) + probe`, where `probe` is a zero tensor of the output's shape
that the step differentiates: its gradient is the layer's output gradient dy, and the hook records x.
A probed weight leaves the differentiated tensors altogether.

Proximal terms declared to the executor (`Workspace.proximal`: FedProx's, Ditto's personal model's)
are probed the same way: the workspace routes them through its `term_probe`, which `LinearProbes.of`
sets to its `term`; on a probed weight in a probed step, `term` returns `||W.detach() - anchor||^2 +
probe`, `probe` a zero scalar whose gradient c is the loss's weight on the term, and the step
applies the term's gradient 2c (W - anchor) itself, as one `lerp_` towards the anchor
(`proximal_sgd_`) before the products. Leaving it to autograd while probing the linear calls would
add a pass over the weight (the proximal gradient's update, then the product, then inductor's copy
back: FedProx's fedfcd-t1 rounds were 28% slower that way); applied by the step, FedProx's round is
19-28% faster than unprobed.

Only weights that the loss reads through linear calls and proximal terms alone are probed:
`probe_plan` finds them, and their calls and terms, eagerly on one client before the step is
compiled. A weight also read elsewhere keeps autograd's gradient.

Only probed modules carry the hook (fewer guards on the compiled steps), and it does nothing outside
a probed step (eager executors, evaluation, other compiled steps). It is a `functools.partial` of a
module-level function, so modules that carry it still copy and pickle.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

if TYPE_CHECKING:
    from autofl.engine.executor import Workspace


class ProbedWeight(NamedTuple):
    """A probed weight: its workspace name, the per-client output shapes of its linear calls (in call
    order), and which of the loss's proximal terms (`term`'s calls, counted in call order over
    the loss) read it."""

    name: str
    calls: tuple[tuple[int, ...], ...]
    pulls: tuple[int, ...] = ()


ProbePlan = tuple[ProbedWeight, ...]
NO_PROBES: ProbePlan = ()
ATTRIBUTE = "autofl_linear_probes"  # the workspace attribute that holds its LinearProbes
# the smallest weight (elements per client) worth probing: the custom op's call costs a fixed few tens of
# microseconds, the saving grows with the weight. Probing FedAvg's 100 x 10 head as well as its 784 x 100
# layer left Ditto's fedfcd-t1 round 3-7% slower than unprobed (in-process A/B); probing the large
# layer only, 0.97-1.08 (no gain), while FedAvg, MOON and the rest run 5-24% faster (docs/benchmarks.md).
MIN_PROBED_WEIGHT = 16384


@torch.library.custom_op("autofl::linear_sgd_", mutates_args=("weight",))
def linear_sgd_(weight: torch.Tensor, out_grads: torch.Tensor, inputs: torch.Tensor, lr: torch.Tensor) -> None:
    """weight[k] -= lr * out_grads[k]^T @ inputs[k] for every client k, in place: stacked (K, out, in)
    weight, (K, rows, out) output gradients and (K, rows, in) inputs of a linear layer's calls; `lr` 0-dim
    or (K,), a rate per client (a population's rows). A custom op, so that inductor calls it on the
    weight's own memory (an in-place `baddbmm_` written in the compiled step would become an out-of-place
    product and a copy back)."""
    weight.baddbmm_((out_grads * -(lr.view(-1, 1, 1) if lr.dim() else lr)).transpose(1, 2), inputs)


@linear_sgd_.register_fake
def _linear_sgd_fake(weight: torch.Tensor, out_grads: torch.Tensor, inputs: torch.Tensor, lr: torch.Tensor) -> None:
    return None


@torch.library.custom_op("autofl::proximal_sgd_", mutates_args=("weight",))
def proximal_sgd_(weight: torch.Tensor, anchor: torch.Tensor, coef: torch.Tensor, lr: torch.Tensor) -> None:
    """weight[k] -= lr * 2 * coef[k] * (weight[k] - anchor[k]) for every client k, in place: the SGD
    step of a proximal term coef[k] * ||w - anchor||^2 (coef[k] the loss's gradient w.r.t. the term,
    e.g. FedProx's mu/2), as one `lerp_` towards the anchor. Stacked (K, ...) weight and anchor
    (an anchor shared by the clients may be an expanded view), (K,) coef, `lr` 0-dim or (K,)."""
    weight.lerp_(anchor.expand_as(weight), (2 * lr * coef).view(-1, *[1] * (weight.dim() - 1)))


@proximal_sgd_.register_fake
def _proximal_sgd_fake(weight: torch.Tensor, anchor: torch.Tensor, coef: torch.Tensor, lr: torch.Tensor) -> None:
    return None


class LinearProbes:
    """One workspace's probing state: the probes to add (`active`, per weight name, consumed in call
    order), the inputs recorded, or (while `probe_plan` looks) the output shapes recorded; the forward
    hooks of its probed `nn.Linear` modules, and the plans found, per update."""

    def __init__(self) -> None:
        self.active: dict[str, list[torch.Tensor]] | None = None
        self.inputs: dict[str, list[torch.Tensor]] = {}
        self.shapes: dict[str, list[tuple[int, ...]]] | None = None
        # proximal terms: the zero probes by term index, the anchors recorded, the terms counted so far;
        # while probe_plan looks, the weights watched and which term read which
        self.pulls: dict[int, torch.Tensor] | None = None
        self.anchors: dict[int, torch.Tensor] = {}
        self.terms = 0
        self.watched: dict[str, torch.Tensor] | None = None
        self.term_weights: dict[int, str] = {}
        self.hooked: set[str] = set()
        self.plans: dict[Any, ProbePlan] = {}
        self.running = False  # a probed step (or a look of probe_plan) runs: `term` probes proximal terms

    def start(self, active: dict[str, list[torch.Tensor]], pulls: dict[int, torch.Tensor]) -> None:
        """A probed step (or probe_plan's second look) begins: `active`'s probes are added to the linear
        calls, `pulls`' to the proximal terms, and their inputs and anchors recorded."""
        self.active, self.inputs, self.pulls, self.anchors, self.terms = active, {}, pulls, {}, 0
        self.running = True

    def stop(self) -> None:
        """A probed step or a look of probe_plan ends: nothing is probed, recorded or watched."""
        self.active, self.inputs, self.pulls, self.anchors, self.terms = None, {}, None, {}, 0
        self.shapes, self.watched, self.term_weights = None, None, {}
        self.running = False

    @classmethod
    def of(cls, ws: Workspace) -> LinearProbes:
        """The probes of `ws`, held as its attribute `autofl_linear_probes`, which compiled code reads (a
        lookup in a table here would be traced and guarded)."""
        probes = getattr(ws, ATTRIBUTE, None)
        if probes is None:
            probes = cls()
            setattr(ws, ATTRIBUTE, probes)
            ws.term_probe = probes.term  # the workspace's proximal terms go through `term` (Workspace.proximal)
        return probes

    def term(
        self, p: torch.Tensor, anchor: torch.Tensor, distance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """`distance(p, anchor)`, the squared distance of a proximal term (`Workspace.proximal`). In a
        probed step, where `p` is a probed weight, it is `distance(p.detach(), anchor) + probe`: `probe` a
        zero scalar that the step differentiates, so its gradient is the loss's weight on the term, and the
        step applies the term's gradient to the weight itself (`proximal_sgd_`), with its linear calls'
        products: the weight leaves autograd, as when the loss reads it through linear calls alone."""
        if not self.running or not torch.is_grad_enabled():
            return distance(p, anchor)
        i = self.terms
        self.terms = i + 1
        if self.watched is not None:
            for name, t in self.watched.items():
                if t is p:
                    self.term_weights[i] = name
            return distance(p, anchor)
        if self.pulls is None or i not in self.pulls:
            return distance(p, anchor)
        self.anchors[i] = anchor.detach()
        return distance(p.detach(), anchor) + self.pulls[i]

    def hook(self, module: nn.Module, weight_name: str) -> torch.utils.hooks.RemovableHandle:
        return module.register_forward_hook(functools.partial(_probe_hook, self, weight_name))


def _probe_hook(
    probes: LinearProbes, weight_name: str, module: nn.Linear, args: tuple[Any, ...], output: torch.Tensor
) -> torch.Tensor | None:
    if not torch.is_grad_enabled():
        return None
    if probes.shapes is not None and weight_name in probes.shapes and output.dim() >= 2:
        probes.shapes[weight_name].append(tuple(output.shape))
        return None
    if probes.active is None or weight_name not in probes.active:
        return None
    calls = probes.inputs.setdefault(weight_name, [])
    if len(calls) == len(probes.active[weight_name]):
        raise RuntimeError(
            f"{weight_name}: more linear calls than probe_plan found (a loss whose layer calls "
            "change between steps cannot be probed)"
        )
    x = args[0]
    probe = probes.active[weight_name][len(calls)]
    calls.append(x.detach())
    return F.linear(x, module.weight.detach(), module.bias) + probe


@contextlib.contextmanager
def end_probes_on_error(ws: nn.Module) -> Iterator[None]:
    """Around a probed step's call: where it stops by an exception (a trial's error, an interrupt), the
    probes it had set are cleared, so that no later loss in the process (another trial's, eager) finds a
    probed step still running. The step clears them itself when it completes."""
    try:
        yield
    except BaseException:
        probes = getattr(ws, ATTRIBUTE, None)
        if probes is not None:
            probes.stop()
        raise


def probe_plan(
    ws: Workspace,
    key: Any,
    loss: Callable[..., torch.Tensor],
    trained: list[str] | tuple[str, ...],
    state: dict[str, torch.Tensor],
    dims: dict[str, int | None],
    x: torch.Tensor,
    y: torch.Tensor,
    flags: dict[str, torch.Tensor],
) -> ProbePlan:
    """The trained linear weights (of at least MIN_PROBED_WEIGHT elements) that the loss reads only
    through linear calls with gradients enabled, with those calls' output shapes for one client: found
    eagerly on client 0 of the stack (`state`, stacked along dim 0 where `dims` says 0; `x`, `y` its
    batch), on copies, so nothing in `state` changes. Found once per workspace and `key` (the update's
    step), while temporary hooks look; the probed modules then keep their hook (the same hook objects
    every round, so compiled steps never see them change), the others carry none."""
    probes = LinearProbes.of(ws)
    if key in probes.plans:
        return probes.plans[key]
    modules = {f"{name}.weight": m for name, m in ws.named_modules() if type(m) is nn.Linear}
    watched = [n for n in trained if n in modules]
    handles = [probes.hook(modules[n], n) for n in watched if n not in probes.hooked]
    try:
        plan = _find_plan(ws, probes, loss, trained, watched, state, dims, x, y, flags)
    finally:
        for handle in handles:
            handle.remove()
    for n in (w.name for w in plan):
        if n not in probes.hooked:
            probes.hook(modules[n], n)
            probes.hooked.add(n)
    probes.plans[key] = plan
    return plan


def client_zero_copies(
    state: dict[str, torch.Tensor],
    dims: dict[str, int | None],
    trained: list[str] | tuple[str, ...],
    flags: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Client 0's tensors of a stack (`state`, stacked along dim 0 where `dims` says 0) as copies, for an
    eager look at one client's step that changes nothing in `state`: the trained ones (requiring
    gradients), the rest, and client 0's flags."""
    one = {n: (t[0] if dims.get(n) == 0 else t).detach().clone() for n, t in state.items()}
    tr = {n: one[n].requires_grad_() for n in trained}
    return tr, {n: t for n, t in one.items() if n not in tr}, {n: f[0] for n, f in flags.items()}


def _find_plan(
    ws: nn.Module,
    probes: LinearProbes,
    loss: Callable[..., torch.Tensor],
    trained: list[str] | tuple[str, ...],
    watched: list[str],
    state: dict[str, torch.Tensor],
    dims: dict[str, int | None],
    x: torch.Tensor,
    y: torch.Tensor,
    flags: dict[str, torch.Tensor],
) -> ProbePlan:
    if not watched:
        return NO_PROBES
    tr, rest, flags0 = client_zero_copies(state, dims, trained, flags)

    def call() -> torch.Tensor:
        return functional_call(ws, (tr, rest), (x, y, flags0, loss), strict=True)

    with torch.enable_grad():
        # first look: the output shapes of the watched weights' linear calls, and which proximal terms
        # read them (by identity: functional_call hands the loss the tensors of `tr` themselves)
        probes.shapes = {n: [] for n in watched}
        probes.watched, probes.term_weights, probes.terms = {n: tr[n] for n in watched}, {}, 0
        probes.running = True
        try:
            call()
            shapes = {n: s for n, s in probes.shapes.items() if s}
            term_weights = dict(probes.term_weights)
        finally:
            probes.stop()
        pulls = {n: tuple(i for i, m in term_weights.items() if m == n) for n in watched}
        candidates = [n for n in watched if n in shapes or pulls[n]]
        if not candidates:
            return NO_PROBES
        # second look, with every candidate probed: a weight autograd no longer reaches is read through
        # its probed calls and terms alone
        probes.start(
            {
                n: [torch.zeros(s, dtype=tr[n].dtype, device=tr[n].device, requires_grad=True) for s in calls]
                for n, calls in shapes.items()
            },
            {
                i: torch.zeros((), dtype=tr[n].dtype, device=tr[n].device, requires_grad=True)
                for i, n in term_weights.items()
            },
        )
        try:
            value = call()
        finally:
            probes.stop()
        grads = torch.autograd.grad(value, [tr[n] for n in candidates], allow_unused=True)
    return tuple(
        ProbedWeight(n, tuple(shapes.get(n, ())), pulls[n])
        for n, g in zip(candidates, grads)
        if g is None and tr[n].numel() >= MIN_PROBED_WEIGHT
    )

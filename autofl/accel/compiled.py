"""`runtime.compile`: the executors' per-step functions compiled with `torch.compile` and replayed.

What is compiled (the executors keep their own loops, optimizers and bookkeeping):
- vectorized on CPU: the whole lockstep step when every training client has a full batch (steps
  where some client is on its shorter last batch take the gradients-only path below): the batches
  gathered from the pooled data, `vmap(grad(loss))` over the stack (forward, the method's loss and
  backward of every client at once) and the optimizer's SGD update, `torch.optim.sgd.sgd` -- the
  function `torch.optim.SGD.step` runs -- applied in place (`batched_sgd_step`; a stage with several
  updates a step, such as Ditto's, FedFCD's or FedSiam-DA's, runs them all in one call,
  `batched_sgd_steps`), for plain SGD (`fl.momentum: 0`, no weight decay: momentum and decay would be
  constants of the graph, one compile per value a search tries). Linear weights that the loss reads
  only through their layer's calls and proximal terms are updated by one in-place product per call
  and one in-place pull towards the anchor per term instead of a gradient and an update
  (`linear_probes`). Whole steps too small to pay a call's overhead alone (FedRep's head epochs and
  DualFed's stage 2 on the encoder's outputs) run several to a call, each on the tensors the one
  before it wrote (`batched_sgd_step_run`, `steps_per_call`). Other steps and optimizers compile
  the gradients only (`batched_grads`) and step `torch.optim.SGD` outside;
- vectorized on CUDA: nothing is compiled; whole steps replay as CUDA graphs (accel/cuda_graphs.py);
- sequential: one client's forward and the method's loss (`client_loss`); AOTAutograd compiles its
  backward with it, so `loss.backward()` replays the compiled backward.

Nothing recompiles across rounds: the compiled functions take the workspace, the loss and every
tensor (parameters, per-client flags, the method's closure tensors such as FedFCD's GFRs) as inputs,
and the whole step takes the learning rate as a 0-dim tensor (a decaying rate replays the same
graph; a population's members' rates, one per row, as a (rows,) tensor), and its batch rows arrive as a contiguous (clients, batch) slice of a step-major tensor, the
same strides whatever the round's step count. Shapes are static (`dynamic=False`): a shape that
changes (the number of clients still training, a smaller last batch) compiles its own variant once,
so uneven clients keep the executors' exact semantics: every client still sees exactly its own batch.

Caching: one compiled function per (executor, method's loss, stage, update, device, mode, inductor
options: calls of several small steps use `small_step_options`), held in
a module-level dict, so the trials a worker process runs one after another reuse what the first
traced; each key gets its own code object, so torch's per-function recompile limit counts one
key's variants (train/eval modes, shapes) and never another key's. Inductor's
generated kernels are cached on disk (`TORCHINDUCTOR_CACHE_DIR`, torch's default
`/tmp/torchinductor_<user>`), so a new process compiles the same step from cache.

The sequential executor's steps compile in "reduce-overhead" mode on CUDA; on CPU the mode is
inductor's default. `auto` decides with `choose_compile`: on CPU by the vectorized trial's lockstep
steps; on CUDA the vectorized executor always replays graphs (nothing to compile) and the sequential
one stays eager (as it does on CPU).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import types
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch.func import functional_call, grad, vmap
from torch.optim.sgd import sgd as sgd_update  # the functional SGD that torch.optim.SGD.step runs
from torch.utils.flop_counter import FlopCounterMode

from autofl.accel import cuda_graphs
from autofl.accel.linear_probes import ATTRIBUTE as PROBES_ATTRIBUTE
from autofl.accel.linear_probes import NO_PROBES, ProbePlan, client_zero_copies, linear_sgd_, proximal_sgd_

# lockstep steps (rounds x the longest client's batches a round) a vectorized trial must run before
# `auto` compiles on CPU. Measured on 2 cores with an empty inductor cache (docs/benchmarks.md,
# fedfcd-t1, 263 steps a round, plain SGD so the whole step with its update compiles, 2026-11-24):
# compiling cost 13-32 s and the compiled round was 1.5-5.1x faster, so it paid from round 5 (fedrep)
# to round 54 (fedgh: 13 s of compile, 0.70 -> 0.46 s a round; fedavg 14 s, 0.66 -> 0.31 s, from
# round 40); since FedRep's head steps run 16 to a call (2026-11-25), its compile took 45 s and paid
# from round 16; DualFed's (stage 2 grouped too) 23 s against 22 s one step a call, paying from round
# 12. 15,000 steps (round 58 there) is past every method's break-even, so `auto` never makes those
# runs slower. The sequential executor's per-client steps ran slower compiled (fedavg 4.10 s
# against 2.26 s a round), so `auto` keeps them eager on CPU.
AUTO_MIN_STEPS_CPU = 15_000

# Several lockstep steps per compiled call (CPU whole steps): a call costs about as much as this much
# arithmetic whatever its size (dynamo's guards on the workspace, some 40 us; the call's Python and
# the executor's bookkeeping; measured 2026-11-25 on 2 cores: FedRep's head step, 0.8 MFLOP over 20
# clients, took 0.20 ms a call alone and 0.10 ms in calls of 16). A step whose arithmetic is below
# it runs in calls of up to MAX_STEPS_PER_CALL steps (`steps_per_call`); a step of FedAvg's mlp
# (64 MFLOP on fedfcd-t1) still runs alone. The steps of a call are unrolled into one graph, so its
# compile time grows with them (FedRep's: 45 s instead of 13 s with an empty inductor cache): the
# cap and MAX_GRAPH_NODES bound it. The count depends on the chunk's clients, so a smaller last chunk
# (`runtime.client_chunk`) may compile one more variant.
CALL_FLOPS = 32e6
MAX_STEPS_PER_CALL = 16
# ... and the graph of a call holds at most about this many autograd nodes of steps (FedRep's head step
# has 6, FedAvg's mlp step 11), so a method whose loss runs many small ops compiles a bounded graph
MAX_GRAPH_NODES = 128


def batched_grads(
    ws: torch.nn.Module,
    loss: Callable[..., torch.Tensor],
    rest_dims: dict[str, int | None],
    tr: dict[str, torch.Tensor],
    rest: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    flags: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per-client gradients of `loss` w.r.t. the trained tensors `tr`, and each client's loss:
    `vmap(grad(functional_call(ws, ...)))` over the leading client dimension."""

    def one_client(
        tr: dict[str, torch.Tensor],
        rest: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        flags: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        value = functional_call(ws, (tr, rest), (x, y, flags, loss), strict=True)
        return value, value.detach()

    return vmap(grad(one_client, has_aux=True), in_dims=(0, rest_dims, 0, 0, 0))(tr, rest, x, y, flags)


def probed_grads(
    ws: torch.nn.Module,
    loss: Callable[..., torch.Tensor],
    rest_dims: dict[str, int | None],
    tr: dict[str, torch.Tensor],
    rest: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    flags: dict[str, torch.Tensor],
    plan: ProbePlan,
) -> tuple[
    dict[str, torch.Tensor],
    dict[str, list[tuple[torch.Tensor, torch.Tensor]]],
    dict[str, list[tuple[torch.Tensor, torch.Tensor]]],
    torch.Tensor,
]:
    """`batched_grads` with the weights of `plan` (`linear_probes.probe_plan`) probed: the gradients of the
    other trained tensors; each probed weight's linear calls as (output gradient, input) pairs and its
    proximal terms as (the loss's weight on the term, anchor) pairs, stacked over clients; and each
    client's loss."""
    if not plan:
        grads, value = batched_grads(ws, loss, rest_dims, tr, rest, x, y, flags)
        return grads, {}, {}, value
    holder = getattr(ws, PROBES_ATTRIBUTE)  # LinearProbes.of(ws), made before compiling
    k = x.shape[0]
    probes = {
        w.name: [torch.zeros(k, *shape, dtype=tr[w.name].dtype, device=x.device) for shape in w.calls]
        for w in plan
        if w.calls
    }
    pulls = {i: torch.zeros(k, dtype=tr[w.name].dtype, device=x.device) for w in plan for i in w.pulls}
    names = {w.name for w in plan}
    tr_d = {n: t for n, t in tr.items() if n not in names}
    rest_p = {**rest, **{n: tr[n] for n in names}}
    dims_p = {**rest_dims, **{n: 0 for n in names}}

    def one_client(
        tr: dict[str, torch.Tensor],
        probes: dict[str, list[torch.Tensor]],
        pulls: dict[int, torch.Tensor],
        rest: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        flags: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, Any]:
        holder.start(probes, pulls)
        value = functional_call(ws, (tr, rest), (x, y, flags, loss), strict=True)
        inputs, anchors = holder.inputs, holder.anchors
        holder.stop()
        return value, (value.detach(), inputs, anchors)

    (grads, out_grads, coefs), (value, inputs, anchors) = vmap(
        grad(one_client, argnums=(0, 1, 2), has_aux=True), in_dims=(0, 0, 0, dims_p, 0, 0, 0)
    )(tr_d, probes, pulls, rest_p, x, y, flags)
    linear = {n: list(zip(out_grads[n], inputs[n])) for n in out_grads}
    proximal = {w.name: [(coefs[i], anchors[i]) for i in w.pulls] for w in plan if w.pulls}
    return grads, linear, proximal, value


def sgd_with_probes(
    tr: dict[str, torch.Tensor],
    grads: dict[str, torch.Tensor],
    linear: dict[str, list[tuple[torch.Tensor, torch.Tensor]]],
    proximal: dict[str, list[tuple[torch.Tensor, torch.Tensor]]],
    lr: torch.Tensor,
    group: dict[str, Any],
) -> None:
    """`torch.optim.sgd.sgd` (the function `torch.optim.SGD.step` runs) on the tensors of `tr` that have
    gradients (`lr` 0-dim, or one rate per row of the stack: plain SGD, `group` then says no momentum and
    no decay), then each probed weight's proximal terms (`proximal_sgd_`, reading the weight before
    this step's change, as its gradient does) and its linear calls (`linear_sgd_`, one in-place product
    each)."""
    names = list(grads)
    with torch.no_grad():
        if lr.dim():  # a rate per row (a population's members): plain SGD, as `sgd` steps each row alone
            assert group["momentum"] == 0 and group["weight_decay"] == 0 and not group["maximize"]
            for n in names:
                tr[n].add_(grads[n] * -lr.view(-1, *[1] * (tr[n].dim() - 1)))
        else:
            sgd_update(
                [tr[n] for n in names],
                [grads[n] for n in names],
                [None] * len(names),
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                lr=lr,
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                maximize=group["maximize"],
                foreach=False,
            )
        for n, terms in proximal.items():
            for coef, anchor in terms:
                proximal_sgd_(tr[n], anchor, coef, lr)
        for n, calls in linear.items():
            for out_grad, inp in calls:
                linear_sgd_(tr[n], out_grad.flatten(1, -2), inp.flatten(1, -2), lr)


def batched_sgd_step(
    ws: torch.nn.Module,
    loss: Callable[..., torch.Tensor],
    rest_dims: dict[str, int | None],
    tr: dict[str, torch.Tensor],
    rest: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    flags: dict[str, torch.Tensor],
    lr: torch.Tensor,
    group: dict[str, Any],
    plan: ProbePlan = NO_PROBES,
) -> torch.Tensor:
    """One whole lockstep step of the vectorized executor (CPU), for plain SGD (no momentum, no weight
    decay): each client's batch gathered from the pooled data by `rows` (K, batch), the per-client
    gradients (`probed_grads`), and the update of the stacked tensors `tr` in place by
    `torch.optim.sgd.sgd`, the function `torch.optim.SGD.step` runs, with the optimizer's settings:
    `lr` a 0-dim tensor (neither a trial's rate nor a decaying one recompiles; a (K,) tensor of rates
    per row for a population, stepped as `sgd` steps each row: `sgd_with_probes`), the rest of its param
    group (`group`) constants of the graph; the linear weights of `plan` by one in-place product per
    call (`linear_probes`). Returns each client's loss."""
    grads, linear, proximal, value = probed_grads(ws, loss, rest_dims, tr, rest, x[rows], y[rows], flags, plan)
    sgd_with_probes(tr, grads, linear, proximal, lr, group)
    return value


def batched_sgd_step_run(
    ws: torch.nn.Module,
    loss: Callable[..., torch.Tensor],
    rest_dims: dict[str, int | None],
    tr: dict[str, torch.Tensor],
    rest: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    flags: dict[str, torch.Tensor],
    lr: torch.Tensor,
    group: dict[str, Any],
    plan: ProbePlan = NO_PROBES,
) -> torch.Tensor:
    """`batched_sgd_step` on each of the (steps, K, batch) `rows` in turn, in one compiled call (steps too
    small to pay a call's overhead alone: `steps_per_call`); each step reads what the one before wrote.
    Returns the (steps, K) losses."""
    return torch.stack(
        [
            batched_sgd_step(ws, loss, rest_dims, tr, rest, x, y, rows[i], flags, lr, group, plan)
            for i in range(rows.shape[0])
        ]
    )


@dataclasses.dataclass(frozen=True)
class StepSize:
    """One client's step of an update: its FLOPs (torch's `FlopCounterMode`: matrix products and
    convolutions, forward and backward) and its autograd graph's nodes (about the ops a compiled graph
    of the step holds)."""

    flops: int
    nodes: int


def steps_per_call(step: StepSize, clients: int) -> int:
    """How many lockstep steps of `clients` clients one compiled call runs: the largest power of two up to
    MAX_STEPS_PER_CALL whose steps together stay within about CALL_FLOPS of arithmetic and
    MAX_GRAPH_NODES of autograd nodes (a power of two, so a stage compiles few variants); 1 for a step
    as large as either."""
    steps = 1
    while (
        steps * 2 <= MAX_STEPS_PER_CALL
        and steps * 2 * step.flops * clients <= CALL_FLOPS
        and steps * 2 * step.nodes <= MAX_GRAPH_NODES
    ):
        steps *= 2
    return steps


def client_step_size(
    ws: torch.nn.Module,
    loss: Callable[..., torch.Tensor],
    trained: list[str] | tuple[str, ...],
    state: dict[str, torch.Tensor],
    dims: dict[str, int | None],
    x: torch.Tensor,
    y: torch.Tensor,
    flags: dict[str, torch.Tensor],
) -> StepSize:
    """The `StepSize` of one client's forward and backward of `loss` on batch (x, y), run eagerly on
    copies of client 0's tensors (`state`, stacked along dim 0 where `dims` says 0), so nothing in
    `state` changes."""
    tr, rest, flags0 = client_zero_copies(state, dims, trained, flags)
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        value = functional_call(ws, (tr, rest), (x, y, flags0, loss), strict=True)
        nodes = autograd_nodes(value.grad_fn)
        torch.autograd.grad(value, list(tr.values()), allow_unused=True)
    return StepSize(counter.get_total_flops(), nodes)


def autograd_nodes(root: Any) -> int:
    """The nodes of the autograd graph reachable from `root` (a tensor's `grad_fn`; None: 0)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        todo.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


def batched_sgd_steps(
    ws: torch.nn.Module,
    losses: tuple[Callable[..., torch.Tensor], ...],
    trained: tuple[tuple[str, ...], ...],
    frozen: tuple[tuple[str, ...], ...],
    dims: dict[str, int | None],
    state: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    flags: dict[str, torch.Tensor],
    lr: torch.Tensor,
    group: dict[str, Any],
    plans: tuple[ProbePlan, ...] | None = None,
) -> list[torch.Tensor]:
    """All the updates of one lockstep step of a stage with several (Ditto's w then v, FedFCD's
    extractor then head, FedSiam-DA's f' then the local model) in one compiled call, for plain SGD:
    `batched_sgd_step` for each update in declaration order (with its probe plan, `plans[i]`), on the
    batch gathered once. The updates share the workspace's tensors (`state`; `dims[name]` 0 where
    stacked, None where shared), so an update reads what the ones before it wrote this step, as in the
    executor's one-call-per-update loop. Returns each update's per-client loss. One call instead of one
    per update: the guards of the workspace (which grow with its models) are checked once a step.

    The workspace runs with every BatchNorm tracking its statistics; `frozen[i]` names the running-
    statistics buffers update i freezes (its `frozen_stats`), which it gets as copies whose writes are
    dropped: a BatchNorm in training mode normalizes by the batch's statistics either way, so this is
    what `track_running_stats = False` (`Workspace.enter`) does."""
    xb, yb = x[rows], y[rows]
    values = []
    for i, (loss, names, frozen_names) in enumerate(zip(losses, trained, frozen)):
        tr = {n: state[n] for n in names}
        rest = {n: t.clone() if n in frozen_names else t for n, t in state.items() if n not in tr}
        grads, linear, proximal, value = probed_grads(
            ws, loss, {n: dims[n] for n in rest}, tr, rest, xb, yb, flags, plans[i] if plans is not None else NO_PROBES
        )
        sgd_with_probes(tr, grads, linear, proximal, lr, group)
        values.append(value)
    return values


def client_loss(
    ws: torch.nn.Module,
    loss: Callable[..., torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    flags: dict[str, torch.Tensor],
) -> torch.Tensor:
    """One client's loss on one batch (the sequential executor's step before backward)."""
    return loss(ws, x, y, flags)


def compile_mode(device: torch.device) -> str:
    return "reduce-overhead" if device.type == "cuda" else "default"


_COMPILED: dict[Hashable, Callable[..., Any]] = {}


def small_step_options(device: torch.device) -> dict[str, Any] | None:
    """Inductor options for a call of several small steps (`batched_sgd_step_run`) on CPU: 256-bit
    vectors where the CPU has 512-bit ones. Such steps' loops run over a few classes or a batch of ten
    (FedRep's head: logits of 20 clients x 10 rows x 10 classes), so 16-lane vectors run mostly as
    masked tails; with 8 lanes FedRep's head step took 56 us instead of 71 us (median of 7
    interleaved repeats, 2026-11-25, Zen 4). Elsewhere the default width is already 256 bits or
    less. Options go to `torch.compile(options=...)`, its public way of setting inductor's config."""
    if device.type == "cpu" and torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return {"cpp.simdlen": 8}
    return None


def compiled(
    fn: Callable[..., Any], key: Hashable, device: torch.device, options: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """`fn` compiled for `key` on `device` (with inductor `options`, CPU only: torch.compile takes a
    mode or options), made once per process and reused (see the module doc)."""
    full_key = (fn.__qualname__, key, device.type, compile_mode(device), tuple(sorted((options or {}).items())))
    if full_key not in _COMPILED:
        # a copy of fn with its own code object: torch caches compiled frames (and counts recompiles) per code object
        code = fn.__code__.replace(co_name=f"{fn.__name__}_{len(_COMPILED)}")
        copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
        assert not options or device.type == "cpu", "options replace the mode, CUDA's is reduce-overhead"
        how = {"options": options} if options else {"mode": compile_mode(device)}
        _COMPILED[full_key] = torch.compile(copy, dynamic=False, **how)
    return _COMPILED[full_key]


def step_key(loss: Callable[..., Any], stage: int, update: int) -> tuple[Any, str, int, int]:
    """What identifies one update's step across rounds and trials: the loss's definition (not the
    closure made this round) and its place in the method's declaration. A loss that computes its stage's
    `inputs` first (`executor.losses_on_inputs`) is keyed by the method's loss it wraps and the module."""
    wrapped = getattr(loss, "computes_inputs_of", None)
    if wrapped is not None:
        name, inner = wrapped
        module, qualname, _, _ = step_key(inner, stage, update)
        return (module, f"{qualname}[on {name}]", stage, update)
    return (getattr(loss, "__module__", None), getattr(loss, "__qualname__", repr(loss)), stage, update)


def before_call(device: torch.device) -> None:
    """CUDA graphs reuse their output memory on the next replay: mark each step as a new one (the
    executors consume a step's outputs before calling the next)."""
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()


def cpu_compiler() -> str | None:
    """The C++ compiler inductor builds CPU kernels with ($CXX, else g++; clang++ on macOS), if it is
    installed; None where it is not (then compiling on CPU would fail at the first step)."""
    name = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")
    return shutil.which(name)


def choose_compile(
    choice: str, device: torch.device, rounds: int, executor: str = "vectorized", steps_per_round: int | None = None
) -> tuple[bool, str]:
    """Whether to compile under runtime.compile = `choice`, and the reason for the log line.
    `steps_per_round`: the executor's lockstep steps a round (the longest client's batches times its
    epochs), None where the data is not loaded yet (the search's banner)."""
    graphs = executor == "vectorized" and cuda_graphs.graphs_on(device)
    if choice == "on":
        return True, (
            "runtime.compile=on, whole steps replayed as CUDA graphs"
            if graphs
            else f"runtime.compile=on, {compile_mode(device)} mode"
        )
    if choice == "off":
        return False, "runtime.compile=off"
    if graphs:
        return True, (
            "runtime.compile=auto: whole steps replayed as CUDA graphs (nothing to compile: a round "
            "captures each stage's step once, at about the cost of one eager step)"
        )
    if device.type != "cuda":
        if executor != "vectorized":
            return False, "runtime.compile=auto: eager, per-client steps on CPU gain nothing from compiling"
        if cpu_compiler() is None:
            return False, (
                "runtime.compile=auto: eager, no C++ compiler for inductor's CPU kernels "
                f"({os.environ.get('CXX', 'g++')} not found; install it or set $CXX)"
            )
        if steps_per_round is None:
            return False, (
                f"runtime.compile=auto: each trial compiles if it runs at least {AUTO_MIN_STEPS_CPU} lockstep steps"
            )
        steps = rounds * steps_per_round
        if steps < AUTO_MIN_STEPS_CPU:
            return False, (
                f"runtime.compile=auto: eager, {steps} lockstep steps are too few to pay the compile "
                f"time on CPU (compiles from {AUTO_MIN_STEPS_CPU})"
            )
        return True, f"runtime.compile=auto: compiled with inductor ({steps} lockstep steps pay the compile time)"
    return False, (
        "runtime.compile=auto: eager, the sequential executor's per-client steps on CUDA gain little "
        "from compiling (runtime.compile=on compiles them in reduce-overhead mode; the vectorized "
        "executor replays whole steps as CUDA graphs)"
    )

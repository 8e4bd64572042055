"""The vectorized executor: a round's sampled clients trained as one batched model.

Every client's starting tensors (parameters, BatchNorm buffers, and the method's per-client copies
such as `prev`, `hist` or the Siamese f') are stacked along a new leading client dimension. Each
lockstep step runs the method's loss once for all active clients with
`vmap(grad(functional_call(...)))` and steps a standard `torch.optim.SGD` over the stacked
tensors (SGD's momentum and weight decay are elementwise, so this is per-client SGD).

Uneven clients (how this stays exact):
- Clients are ordered by (number of batches, size of the last batch), both descending, so at
  every step the clients that still have a batch are a prefix of the stack, and clients whose
  batch at that step has the same size form contiguous runs. Each run is one vmapped call on a
  slice (a view, no copy): every client sees exactly its own batch, so batch-dependent losses
  (SupCon, contrastive terms, BatchNorm statistics) are those of the sequential executor.
- A client that has run out of batches gets a zero gradient, but momentum and weight decay would
  still move it. It is *restored* instead: when a client finishes an epoch its rows (all stacked
  tensors and the optimizers' momentum buffers) are copied aside, and copied back at the end of
  the epoch, before the next epoch or stage starts. The stale steps in between are discarded.
- Copies that no update trains and no snapshot writes, and that every client shares (FDCL's and
  MOON's received global model, FedProx's anchor), are passed unbatched instead of stacked.

Memory: with K clients in a chunk (`runtime.client_chunk`, default all sampled clients) and P
the size of one model's state, the chunk holds K x P for each stacked model of the workspace
(the model, plus per-client copies: 1 for FedAvg-like methods, 2 for FDCL/MOON `prev`, 3 for
FedSiam-DA's f' and `hist`), plus for each trained tensor a gradient and a momentum buffer
(K x P each, momentum only when fl.momentum > 0), plus an end-of-epoch copy (K x P per stacked
model), plus the activations of K x batch_size samples. Roughly 5 x K x P for FedAvg. With CUDA-graph
steps (runtime.compile on a GPU) the stacked tensors, optimizers and graphs stay between rounds
(accel/graph_arena.py), so a round's graphs replay in the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch
from torch.func import functional_call
from torch.optim.sgd import sgd as sgd_update  # the functional SGD that torch.optim.SGD.step runs

from autofl.accel import compiled, cuda_graphs
from autofl.accel.graph_arena import RoundArena, loss_holds
from autofl.accel.linear_probes import ProbePlan, end_probes_on_error, probe_plan
from autofl.engine.executor import (
    ClientJob,
    ClientOutcome,
    RoundPlan,
    Workspace,
    batch_cuts,
    epoch_orders,
    losses_on_inputs,
    outputs_by_slices,
    stage_inputs,
    stage_models,
)
from autofl.engine.plan import Stage, Update, flag_tensor

# a stage's steps with shorter batches replay graphs of their own from this many epochs on (`_graphed_runs`)
PATTERN_GRAPH_EPOCHS = 3
# at most this many patterns of shorter batches take graphs of their own (`_graphed_runs`): cifar10-cnn's 20
# clients of Dirichlet sizes meet 18 a round, fedfcd-t1's 3 to 7; the rest of a step's graphs is room for
# its whole step's and a new round's keys (`cuda_graphs.MAX_GRAPHS`)
MAX_PATTERN_GRAPHS = 24


def stacked_flag(values: list[float | torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One flag of every client, stacked on a first axis (numbers: a vector; tensors of one shape: that shape
    behind it; each as `flag_tensor` makes it)."""
    if all(not isinstance(v, torch.Tensor) for v in values):
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.stack([flag_tensor(v, dtype, device) for v in values])


class VectorizedExecutor:
    name = "vectorized"

    def __init__(self, ws: Workspace, client_chunk: int | None = None, compile_steps: bool = False):
        self.ws = ws
        self.client_chunk = client_chunk
        self.compile_steps = compile_steps  # runtime.compile: the batched step runs compiled (accel/compiled.py)
        # with CUDA-graph steps: the tensors, optimizers and graphs of chunks of K clients, kept across rounds
        # and shared by a round's chunks of one size, which run one after another (graph_arena)
        self.arenas: dict[int, RoundArena] = {}

    def train(self, plan: RoundPlan, jobs: list[ClientJob], x: torch.Tensor, y: torch.Tensor) -> list[ClientOutcome]:
        sizes = [[b - a for a, b in batch_cuts(len(job.train_idx), plan.batch_size)] for job in jobs]
        order = sorted(range(len(jobs)), key=lambda i: (-len(sizes[i]), -(sizes[i][-1] if sizes[i] else 0)))
        chunk = self.client_chunk or len(jobs) or 1
        outcomes: dict[int, ClientOutcome] = {}
        for start in range(0, len(order), chunk):
            members = order[start : start + chunk]
            arena = self.arenas.setdefault(len(members), RoundArena())
            for i, outcome in zip(
                members,
                _ChunkRun(self.ws, plan, [jobs[i] for i in members], x, y, self.compile_steps, arena, start).run(),
            ):
                outcomes[i] = outcome
            plan.finished(len(members))
        return [outcomes[i] for i in range(len(jobs))]


class _ChunkRun:
    """One chunk of clients, already sorted by (batches, last batch size) descending."""

    def __init__(
        self,
        ws: Workspace,
        plan: RoundPlan,
        jobs: list[ClientJob],
        x: torch.Tensor,
        y: torch.Tensor,
        compile_steps: bool = False,
        arena: RoundArena | None = None,
        chunk: int = 0,
    ):
        self.ws, self.plan, self.jobs, self.x, self.y = ws, plan, jobs, x, y
        self.compile_steps = compile_steps
        self.k = len(jobs)
        self.device = x.device
        self.graph_steps = compile_steps and cuda_graphs.graphs_on(self.device)  # whole steps as CUDA graphs
        # what the graphs read, kept from the chunk's earlier rounds (with graph steps only)
        self.arena = (arena or RoundArena()) if self.graph_steps else None
        self.chunk = chunk  # the chunk's first client in the round's order: its patterns are its own (`seen`)
        self.orders = [epoch_orders(job, plan) for job in jobs]  # [client][stage][epoch] -> rows
        self.cuts = [batch_cuts(len(job.train_idx), plan.batch_size) for job in jobs]
        self.state, self.batched, self.common = self._stack_state()
        # stacked buffers a forward may write (BatchNorm running statistics)
        self.stacked_buffers = [n for n, _ in ws.named_buffers() if self.batched.get(n, False)]
        self._lr: tuple[float, torch.Tensor] | None = None  # the SGD rate as a tensor, one per stage's rate
        flag_names = list(jobs[0].start.flags)
        self.flags = {
            n: self._flag(n, stacked_flag([job.start.flags[n] for job in jobs], x.dtype, self.device))
            for n in flag_names
        }
        # report key -> each step's (lo, hi, batch size, first client of `losses`, per-client mean losses)
        self.meters: dict[str, list[tuple[int, int, int, int, torch.Tensor]]] = {}
        self._lockstep_plan: list[tuple[int, list[tuple[int, int, int]], int]] | None = None
        self.dims = {n: 0 if b else None for n, b in self.batched.items()}
        # what a stage's steps read (`_enter_stage`): the stack, with the parameters no stage has
        # trained yet and every client received as one tensor passed unstacked
        self.touched: set[str] = set()
        self.stage_state, self.stage_dims = self.state, self.dims

    # ----- stacking ----------------------------------------------------------------------------
    def _stack_state(self) -> tuple[dict[str, torch.Tensor], dict[str, bool], dict[str, torch.Tensor]]:
        """Workspace tensor name -> stacked (K, ...) tensor, or the shared tensor itself; and the
        stacked parameters that every client starts from as one tensor (the received global model's,
        say), that tensor (`_enter_stage`)."""
        written = set().union(*(stage_models(stage) | set(stage.snapshot_after_epoch) for stage in self.plan.stages))
        params = {n for n, _ in self.ws.named_parameters()}
        state: dict[str, torch.Tensor] = {}
        batched: dict[str, bool] = {}
        common: dict[str, torch.Tensor] = {}
        for name in self.ws.model_names():
            per_client = [job.start.models[name] for job in self.jobs]
            for key in per_client[0]:
                tensors = [s[key] for s in per_client]
                full = f"{name}.{key}"
                if name not in written and all(t is tensors[0] for t in tensors):
                    state[full], batched[full] = tensors[0].to(self.device), False
                else:
                    state[full], batched[full] = torch.stack(tensors).to(self.device), True
                if self.arena is not None:
                    state[full] = self.arena.stacked(full, batched[full], state[full])
                if batched[full] and full in params and all(t is tensors[0] for t in tensors):
                    common[full] = state[full][0] if self.arena is None else self.arena.row_view(full, state[full])
        return state, batched, common

    def _flag(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """A per-client flag's tensor: `values`, or with graph steps the chunk's kept tensor holding them."""
        return values if self.arena is None else self.arena.flag(name, values)

    def _optimizer(self, key: tuple[int, int], names: list[str]) -> torch.optim.Optimizer:
        """An update's optimizer over the stack's tensors: new, or with graph steps the chunk's kept one reset
        (`RoundArena.optimizer`), which its graphs step."""
        fresh = self.plan.optimizer([self.state[n] for n in names])
        return fresh if self.arena is None else self.arena.optimizer(key, fresh)

    def _enter_stage(self, stage: Stage, param_names: list[list[str]]) -> None:
        """What this stage's steps read: the stack, except the parameters that every client received
        as one tensor and that neither this stage nor an earlier one trains or overwrites (FedRep's
        head epochs, with the received encoder frozen). Those are still equal in every client's row, so
        the stage reads them once, unstacked (a view of row 0): a frozen layer's batched product over
        20 copies of one weight becomes a single product over the clients' stacked rows."""
        self.touched |= {n for names in param_names for n in names}
        self.touched |= {n for n in self.state if n.split(".", 1)[0] in stage.snapshot_after_epoch}
        self.stage_state, self.stage_dims = self._read_view()

    def _read_view(self) -> tuple[dict[str, torch.Tensor], dict[str, int | None]]:
        """Every workspace tensor as a stage reads it, and its client dimension (0, or None where
        unstacked): the stack, or the one received tensor where no stage has touched it yet."""
        unstacked = {n: t for n, t in self.common.items() if n not in self.touched}
        return {**self.state, **unstacked}, {**self.dims, **dict.fromkeys(unstacked)}

    def _stacked_names(self) -> list[str]:
        return [n for n, b in self.batched.items() if b]

    @contextlib.contextmanager
    def kept_buffers(self, hi: int) -> Iterator[dict[str, torch.Tensor]]:
        """Copies of the stacked buffers for a compiled call on the whole stack when only clients 0:hi
        train (none when all do): the call writes into the copies, and afterwards rows 0:hi are copied
        back, so clients past their last batch (fed padding rows) keep their BatchNorm statistics."""
        copies = {n: self.state[n].clone() for n in self.stacked_buffers} if hi < self.k else {}
        yield copies
        with torch.no_grad():
            for n, copy in copies.items():
                self.state[n][:hi] = copy[:hi]

    def fused_sgd(self, opt: torch.optim.Optimizer) -> bool:
        """Whether a compiled whole step runs `opt`'s update: plain SGD, one param group, no momentum and no
        weight decay (either would be a constant of the compiled graph: one compile per value a search
        tries)."""
        if type(opt) is not torch.optim.SGD or len(opt.param_groups) != 1:
            return False
        group = opt.param_groups[0]
        return group["momentum"] == 0 and group["weight_decay"] == 0 and not group["maximize"]

    def fused_sgd_all(self, opts: list[torch.optim.Optimizer]) -> bool:
        """Whether one compiled call runs all of a stage's updates: every optimizer `fused_sgd`, all at one
        learning rate (fixed for a stage: its optimizers are made at its start)."""
        return all(self.fused_sgd(o) for o in opts) and len({o.param_groups[0]["lr"] for o in opts}) == 1

    def sgd_inputs(self, opt: torch.optim.Optimizer) -> tuple[list[torch.Tensor], torch.Tensor, dict[str, Any]]:
        """What a compiled SGD update takes from an optimizer `fused_sgd` accepts: the tensors it steps, the
        learning rate as a 0-dim tensor (made once per rate, not per step) and the rest of its settings."""
        group = opt.param_groups[0]
        if self._lr is None or self._lr[0] != group["lr"]:
            self._lr = (group["lr"], torch.tensor(group["lr"], dtype=group["params"][0].dtype))
        settings = {k: group[k] for k in ("weight_decay", "momentum", "dampening", "nesterov", "maximize")}
        return group["params"], self._lr[1], settings

    def probe_plan(
        self, key: Any, update: Update, trained: list[str] | tuple[str, ...], rows: torch.Tensor
    ) -> ProbePlan:
        """`linear_probes.probe_plan` for an update's compiled whole step (`key`: its step's), on client 0's
        batch of `rows`."""
        return probe_plan(
            self.ws,
            key,
            update.loss,
            trained,
            self.stage_state,
            self.stage_dims,
            self.x[rows[0]],
            self.y[rows[0]],
            self.flags,
        )

    # ----- training ------------------------------------------------------------------------------
    def run(self) -> list[ClientOutcome]:
        for s, stage in enumerate(self.plan.stages):
            module = stage_inputs(self.ws, stage)
            table = None if module is None else self._inputs_table(stage, module)
            if table is not None and self.arena is not None:
                table = self.arena.table(s, table)  # the same tensor every round: graph steps read it
            if table is None:
                self._run_stage(s, losses_on_inputs(stage))
                continue
            pooled, self.x = self.x, table  # the stage's batches are gathered from the table's rows
            try:
                self._run_stage(s, stage)
            finally:
                self.x = pooled
        self.ws.leave()
        keys = list(self.ws.model.state_dict())
        metered = self._metered()
        outcomes = []
        for i in range(self.k):
            state = {key: self.state[f"model.{key}"][i].clone() for key in keys}
            losses = {n: totals[i] / max(counts[i], 1) for n, (totals, counts) in metered.items()}
            losses.setdefault("loss", 0.0)
            outcomes.append(ClientOutcome(state, losses))
        return outcomes

    def _inputs_table(self, stage: Stage, module: torch.nn.Module) -> torch.Tensor | None:
        """A stage's `inputs` module computed ahead (`stage_inputs`): a table of the pooled data's rows
        where each client's rows hold the module's outputs by that client's weights, one call per client
        over all of its rows (one call for all when every client holds the received weights). The steps
        gather the stage's inputs with the rows they use for the pooled data, and the table's shape is
        the same in every round. None when clients share rows (then the losses compute the module batch
        by batch) or none has any."""
        idx = [job.train_idx.to(self.device) for job in self.jobs]
        every_row = torch.cat(idx)
        if not len(every_row) or len(every_row.unique()) < len(every_row):
            return None
        prefix = f"{stage.inputs}."
        # the module's tensors as the stage reads them (the stage neither trains nor overwrites them)
        state, dims = self._read_view()
        tensors = {n[len(prefix) :]: (t, dims[n]) for n, t in state.items() if n.startswith(prefix)}
        if all(dim is None for _, dim in tensors.values()):  # one module for all: one call over every row
            idx = [every_row]
        table: torch.Tensor | None = None
        for i, rows in enumerate(idx):
            if not len(rows):
                continue
            weights = {n: t[i] if dim == 0 else t for n, (t, dim) in tensors.items()}
            outputs = outputs_by_slices(lambda xs: functional_call(module, weights, (xs,)), self.x, rows)  # noqa: B023 - called in this iteration
            if table is None:
                table = outputs.new_zeros(len(self.x), *outputs.shape[1:])
            table.index_copy_(0, rows, outputs)
        return table

    def _run_stage(self, s: int, stage: Stage) -> None:
        trained_models = stage_models(stage)
        param_names = [self.ws.param_names(u.trains) for u in stage.updates]
        for names in param_names:
            for n in names:
                if not self.batched[n]:
                    raise RuntimeError(f"{n}: a trained tensor must be stacked")
        opts = [self._optimizer((s, i), names) for i, names in enumerate(param_names)]
        self._enter_stage(stage, param_names)
        steps = [self._make_step(u, names, (s, i)) for i, (u, names) in enumerate(zip(stage.updates, param_names))]
        # runtime.compile on CPU, several updates a step with plain SGD at one learning rate (a population's:
        # one per row, the same for every update): all of them
        # in one call on the steps where every active client has a full batch
        together = (
            _StageStep(self, stage, param_names, s, opts)
            if self.compile_steps
            and not self.graph_steps
            and self.device.type == "cpu"
            and len(stage.updates) > 1
            and self.fused_sgd_all(opts)
            else None
        )
        n_steps = [len(c) for c in self.cuts]
        max_steps = max(n_steps, default=0)
        calls: dict[int, int] | None = None  # step -> the steps its call runs (the same in every epoch)
        patterns: set[tuple[tuple[int, int, int], ...]] = set()
        for e in range(self.plan.epochs(stage)):
            batch_rows = self._batch_rows(s, e, max_steps)
            finished_early = sum(1 for c in n_steps if c == max_steps)  # rows past this finish early
            saved = (
                {n: torch.empty_like(self.state[n]) for n in self._stacked_names()} if finished_early < self.k else {}
            )  # nothing to restore when all end together
            saved_momentum: dict[tuple[int, str], torch.Tensor] = {}
            idle = sum(1 for c in n_steps if c > 0)  # clients with no batch at all keep their start
            if idle < self.k:
                self._save_rows(saved, saved_momentum, opts, param_names, idle, self.k)
            lock = self._lockstep(max_steps)
            # steps with shorter batches: graphs of their own for the patterns this stage met last round, and
            # in a long stage for every pattern from its second epoch (each shape runs eagerly once before a
            # capture records it): `_graphed_runs`
            if e == 0:
                patterns = self._graphed_runs(lock)
                for step_fn, opt in zip(steps, opts):
                    step_fn.graphed_runs = patterns & self._seen_patterns(step_fn, opt)
            elif e == 1 and self.plan.epochs(stage) >= PATTERN_GRAPH_EPOCHS:
                for step_fn in steps:
                    step_fn.graphed_runs = patterns
            if calls is None:  # runtime.compile on CPU, one update a step: runs of small whole steps, one call each
                calls = {}
                if len(steps) == 1 and max_steps:
                    self.ws.enter(trained_models, stage.updates[0])  # measured in the modes it runs in
                    calls = self._calls(lock, steps[0].steps_per_call(batch_rows[0], opts[0]))
            skip = 0
            for step, (active, runs, done_lo) in enumerate(lock):
                if skip:  # ran in the call of an earlier step
                    skip -= 1
                    continue
                if step in calls:
                    self.ws.enter(trained_models, stage.updates[0])
                    losses = steps[0].whole_step(active, batch_rows[step : step + calls[step]], opts[0])
                    if stage.updates[0].report is not None:
                        for loss in losses:
                            self._meter(stage.updates[0].report, 0, active, self.plan.batch_size, loss)
                    skip = calls[step] - 1
                    continue
                if together is not None and len(runs) == 1 and runs[0][2] == self.plan.batch_size:
                    self.ws.enter(trained_models, together.tracking)
                    update_losses = together.whole_step(runs[0][1], batch_rows[step], opts)
                    for update, loss in zip(stage.updates, update_losses):
                        if update.report is not None:
                            self._meter(update.report, 0, runs[0][1], runs[0][2], loss)
                else:
                    for update, names, step_fn, opt in zip(stage.updates, param_names, steps, opts):
                        self.ws.enter(trained_models, update)
                        self._update(update, names, step_fn, opt, runs, batch_rows[step], active)
                if done_lo < active:  # rows done_lo:active finished their epoch
                    self._save_rows(saved, saved_momentum, opts, param_names, done_lo, active)
            if finished_early < self.k:
                self._restore_rows(saved, saved_momentum, opts, param_names, finished_early)
            self.ws.leave()
            for target, source in stage.snapshot_after_epoch.items():
                for key in self.ws.get_submodule(source).state_dict():
                    self.state[f"{target}.{key}"].copy_(self.state[f"{source}.{key}"])
            for key, value in stage.flags_after_epoch.items():
                if key in self.flags:  # in place: a step's CUDA graphs read the flags where they are
                    self.flags[key].fill_(value)
                else:
                    self.flags[key] = self._flag(
                        key, torch.full((self.k,), value, dtype=self.x.dtype, device=self.device)
                    )
        if self.arena is not None and max_steps:
            for step_fn, opt in zip(steps, opts):
                self.arena.seen[(self.chunk, *step_fn.where)] = (step_fn.loss_holds, _settings(opt), patterns)

    def _batch_rows(self, s: int, e: int, max_steps: int) -> torch.Tensor:
        """(steps, K, batch) row indices of epoch e of stage s (padding rows are never read); step-major,
        so a step's (K, batch) slice is contiguous with the same strides in every chunk and round (the
        compiled whole step guards on them: a stride per `steps` would recompile it)."""
        bs = self.plan.batch_size
        rows = torch.zeros(max_steps, self.k, bs, dtype=torch.int64, device=self.device)
        for i, cuts in enumerate(self.cuts):
            order = self.orders[i][s][e]
            full = len(cuts) - (1 if cuts and cuts[-1][1] - cuts[-1][0] != bs else 0)  # only a last batch is short
            if full:
                rows[:full, i] = order[: full * bs].view(full, bs)
            for j, (a, b) in enumerate(cuts[full:], start=full):
                rows[j, i, : b - a] = order[a:b]
        return rows

    def _lockstep(self, max_steps: int) -> list[tuple[int, list[tuple[int, int, int]], int]]:
        """Per step of an epoch (the same in every epoch and stage): the clients still training (a
        prefix of the stack), their runs of one batch size, and how many train on after this step."""
        if self._lockstep_plan is None:
            n_steps = [len(c) for c in self.cuts]  # descending: clients are sorted by their batches
            plan = []
            active = done = len(n_steps)
            for step in range(max_steps):
                while active and n_steps[active - 1] <= step:
                    active -= 1
                while done and n_steps[done - 1] <= step + 1:
                    done -= 1
                # all but their last batches are full: most steps are one run of every active client
                runs = (
                    [(0, active, self.plan.batch_size)]
                    if active and step < n_steps[active - 1] - 1
                    else self._runs(step, active)
                )
                plan.append((active, runs, done))
            self._lockstep_plan = plan
        assert len(self._lockstep_plan) == max_steps  # cuts, hence steps, are fixed per chunk
        return self._lockstep_plan

    def _calls(self, lock: list[tuple[int, list[tuple[int, int, int]], int]], per_call: int) -> dict[int, int]:
        """The steps that start a compiled call of `per_call` whole steps (`_Step.steps_per_call`), each
        mapped to `per_call`: runs of consecutive steps where the same active clients all have a full
        batch and none finishes its epoch (then its rows are saved after that step), cut into calls of
        `per_call`; the rest run one step a call. Empty when `per_call` is 1."""
        calls: dict[int, int] = {}
        if per_call < 2:
            return calls
        start = 0
        for step, (active, runs, done_lo) in enumerate([*lock, (0, [], 0)]):
            groupable = len(runs) == 1 and runs[0][2] == self.plan.batch_size and done_lo == active
            if groupable and step > start and active == lock[start][0]:
                continue
            for first in range(start, step - per_call + 1, per_call):
                calls[first] = per_call
            start = step if groupable else step + 1
        return calls

    def _graphed_runs(
        self, lock: list[tuple[int, list[tuple[int, int, int]], int]]
    ) -> set[tuple[tuple[int, int, int], ...]]:
        """With CUDA-graph steps, the patterns of runs (the steps where some active clients have shorter
        batches) that may replay as graphs of their own (`_Step.graphed` with runs), if they fit among a
        step's graphs (`MAX_PATTERN_GRAPHS`, fewer than `cuda_graphs.MAX_GRAPHS`). A pattern takes its graph
        where it recurs: from a stage's second epoch on in a stage of at least `PATTERN_GRAPH_EPOCHS` epochs
        (FedRep's head epochs), and from the first epoch where the update met it last round with the same
        loss (`_seen_patterns`: with every client sampled, a round's patterns are the last one's). Its first
        occurrence runs eagerly, the next is captured (at about an eager step's cost) and replayed; where a
        pattern does not recur that would not pay, and its step goes by `_mixed_step`."""
        if not self.graph_steps:
            return set()
        bs = self.plan.batch_size
        patterns = {tuple(runs) for _, runs, _ in lock if not (len(runs) == 1 and runs[0][2] == bs)}
        return patterns if len(patterns) <= min(MAX_PATTERN_GRAPHS, cuda_graphs.MAX_GRAPHS - 1) else set()

    def _seen_patterns(self, step: _Step, opt: torch.optim.Optimizer) -> set[tuple[tuple[int, int, int], ...]]:
        """The patterns of runs `step`'s update met last round in this chunk, if its loss (`loss_holds`) and
        its optimizer's settings are the same: its graphs of them are kept. Otherwise (another loss, a
        learning rate decayed since) they would capture anew, which a pattern met once a round does not pay."""
        seen = self.arena.seen.get((self.chunk, *step.where)) if self.arena is not None else None
        if seen is None:
            return set()
        holds, settings, patterns = seen
        same = (
            len(holds) == len(step.loss_holds)
            and all(a is b for a, b in zip(holds, step.loss_holds))
            and settings == _settings(opt)
        )
        return patterns if same else set()

    def _runs(self, step: int, active: int) -> list[tuple[int, int, int]]:
        """(lo, hi, batch size): contiguous runs of active clients whose batch at `step` has one size."""
        runs: list[tuple[int, int, int]] = []
        for i in range(active):
            a, b = self.cuts[i][step]
            if runs and runs[-1][2] == b - a:
                runs[-1] = (runs[-1][0], i + 1, b - a)
            else:
                runs.append((i, i + 1, b - a))
        return runs

    def _make_step(self, update: Update, trained: list[str], where: tuple[int, int]) -> _Step:
        return _Step(self, update, trained, where)

    def _update(
        self,
        update: Update,
        names: list[str],
        step: _Step,
        opt: torch.optim.Optimizer,
        runs: list[tuple[int, int, int]],
        rows: torch.Tensor,
        active: int,
    ) -> None:
        lo0, hi0, size0 = runs[0] if runs else (0, 0, 0)
        if step.graphs is not None and len(runs) == 1 and size0 == self.plan.batch_size:
            # runtime.compile on CUDA: every active client has a full batch, so the whole step
            # (gradients and the optimizer's step) replays as one CUDA graph (see _Step.graphed)
            loss = step.graphed(rows, opt)
            if update.report is not None:
                self._meter(update.report, lo0, hi0, size0, loss)
            return
        if step.graphs is not None and step.graphs.failed is None and tuple(runs) in step.graphed_runs:
            # runtime.compile on CUDA: this step's pattern of shorter batches recurs (every epoch of a long
            # stage, or every round), so its eager step replays as a graph of its own (see _Step.graphed)
            losses = step.graphed(rows, opt, tuple(runs))
            if update.report is not None:
                for (lo, hi, size), loss in zip(runs, losses):
                    self._meter(update.report, lo, hi, size, loss, start=lo)
            return
        if (
            step.graphs is not None
            and step.graphs.failed is None
            and size0 == self.plan.batch_size
            and _slices_step(opt, names, self.state)
        ):
            # runtime.compile on CUDA, clients 0:hi0 on full batches and the others on shorter last ones:
            # the full batches replay the whole step's graph, the shorter ones step eagerly (_mixed_step)
            self._mixed_step(update, names, step, opt, runs, rows)
            return
        if step.whole is not None and len(runs) == 1 and size0 == self.plan.batch_size and self.fused_sgd(opt):
            # runtime.compile on CPU: every active client has a full batch, so the whole step (gather,
            # gradients and SGD update) is one compiled call over the stack (see _Step.whole_step)
            loss = step.whole_step(hi0, rows, opt)
            if update.report is not None:
                self._meter(update.report, lo0, hi0, size0, loss)
            return
        if step.compiled is not None and size0 == self.plan.batch_size:
            # runtime.compile: the first run is a prefix of the stack with full-size batches; it runs
            # compiled on the whole stack (one static shape, see _Step.prefix). Its gradients become the
            # stack's: the other runs overwrite their own rows, and the rows of clients past their last
            # batch (hi of the last run on) hold stale values, undone when their rows are restored
            full = rows[:, :size0]
            grads, loss = step.prefix(hi0, self.x[full], self.y[full])
            for n in names:
                self.state[n].grad = grads[n]
            if update.report is not None:
                self._meter(update.report, lo0, hi0, size0, loss)
            later = runs[1:]
        else:
            if not (len(runs) == 1 and runs[0][0] == 0 and runs[0][1] == self.k):
                for n in names:
                    self.state[n].grad = torch.zeros_like(self.state[n])
            later = runs
        for lo, hi, size in later:
            idx = rows[lo:hi, :size]
            grads, loss = step(lo, hi)(self.x[idx], self.y[idx])
            for n in names:
                if lo == 0 and hi == self.k:
                    self.state[n].grad = grads[n]
                else:
                    grad = self.state[n].grad
                    assert grad is not None  # set above: by the compiled prefix, or zeros
                    grad[lo:hi] = grads[n]
            if update.report is not None:
                self._meter(update.report, lo, hi, size, loss, start=lo)
        opt.step()

    def _mixed_step(
        self,
        update: Update,
        names: list[str],
        step: _Step,
        opt: torch.optim.Optimizer,
        runs: list[tuple[int, int, int]],
        rows: torch.Tensor,
    ) -> None:
        """One step where clients 0:hi0 (the first run) have full batches and the later runs shorter last
        batches, with CUDA-graph steps: the eager step would run one `vmap(grad)` call per run, each a few
        milliseconds of Python and kernel launches on a GPU, once per epoch for each such step. Here the
        first run takes the whole step's graph (`_Step.graphed`), as a step where all have full batches
        does: it steps every row, the later runs' rows on padding. Those rows (what the step writes: the
        trained tensors, the stacked buffers, the momentum buffers) are copied before and put back after,
        and the later runs then step eagerly, each on its own rows (`_Step.__call__`), updated by SGD on
        those rows alone (`torch.optim.sgd.sgd`, the function `opt.step()` runs, on views of the stack).
        Every client gets the update the eager step gives it."""
        lo1, active = runs[1][0], runs[-1][1]
        momentum = [buf for _, buf in self._momentum([opt], [names])]  # one per name, or none (momentum 0)
        written = [*names, *(n for n in self.stacked_buffers if n not in names)]
        written_tensors = [*(self.state[n] for n in written), *momentum]
        kept = [t[lo1:active].clone() for t in written_tensors]
        loss = step.graphed(rows, opt)
        if update.report is not None:
            self._meter(update.report, *runs[0], loss)
        with torch.no_grad():
            for t, copy in zip(written_tensors, kept):
                t[lo1:active] = copy
        group = opt.param_groups[0]
        for lo, hi, size in runs[1:]:
            idx = rows[lo:hi, :size]
            grads, loss = step(lo, hi)(self.x[idx], self.y[idx])
            with torch.no_grad():
                sgd_update(
                    [self.state[n][lo:hi] for n in names],
                    [grads[n] for n in names],
                    [m[lo:hi] for m in momentum] if momentum else [None] * len(names),
                    foreach=group["foreach"],
                    weight_decay=group["weight_decay"],
                    momentum=group["momentum"],
                    lr=group["lr"],
                    dampening=group["dampening"],
                    nesterov=group["nesterov"],
                    maximize=group["maximize"],
                )
            if update.report is not None:
                self._meter(update.report, lo, hi, size, loss, start=lo)

    def _meter(self, key: str, lo: int, hi: int, size: int, losses: torch.Tensor, start: int = 0) -> None:
        """Record a step's mean losses of clients lo:hi on batches of `size` (`losses[j]`: client
        start + j's) under the report `key`. Nothing is added up here (a step's few tensor operations
        cost about as much as a small step's compute): `_metered` does, once per chunk. With CUDA-graph
        steps the losses are copied, since a graph's next replay reuses its outputs' memory."""
        losses = losses.detach()
        self.meters.setdefault(key, []).append((lo, hi, size, start, losses.clone() if self.graph_steps else losses))

    def _metered(self) -> dict[str, tuple[list[float], list[int]]]:
        """Per report key, each client's summed sample losses and its sample count: the steps recorded
        alike (the same clients, batch size and layout; in a lockstep epoch nearly all of them) are
        added up together, step after step. Not `torch.stack(...).sum(0)`: how that reduction orders
        its additions depends on the number of rows and the CPU's vector width (on an AVX-512 CPU a
        population's C x K rows and a run alone's K rows differed in a client's last bit)."""
        metered = {}
        for key, steps in self.meters.items():
            alike: dict[tuple[int, int, int, int, int], list[torch.Tensor]] = {}
            for lo, hi, size, start, losses in steps:
                alike.setdefault((lo, hi, size, start, len(losses)), []).append(losses)
            totals = torch.zeros(self.k, dtype=self.x.dtype, device=self.device)
            counts = [0] * self.k
            for (lo, hi, size, start, _), same in alike.items():
                summed = torch.zeros_like(same[0])
                for losses in same:  # each row's own additions, in step order, whatever the rows
                    summed += losses
                totals[lo:hi] += summed[lo - start : hi - start] * size
                for i in range(lo, hi):
                    counts[i] += size * len(same)
            metered[key] = (totals.tolist(), counts)
        return metered

    # ----- keeping idle clients still ------------------------------------------------------------
    def _momentum(self, opts: list[torch.optim.Optimizer], param_names: list[list[str]]):
        for u, (opt, names) in enumerate(zip(opts, param_names)):
            for n in names:
                buf = opt.state.get(self.state[n], {}).get("momentum_buffer")
                if isinstance(buf, torch.Tensor):
                    yield (u, n), buf

    def _save_rows(
        self,
        saved: dict[str, torch.Tensor],
        saved_momentum: dict[tuple[int, str], torch.Tensor],
        opts: list[torch.optim.Optimizer],
        param_names: list[list[str]],
        lo: int,
        hi: int,
    ) -> None:
        for n, buf in saved.items():
            buf[lo:hi] = self.state[n][lo:hi]
        for key, mom in self._momentum(opts, param_names):
            if key not in saved_momentum:
                saved_momentum[key] = torch.zeros_like(mom)  # rows saved before it existed: none yet
            saved_momentum[key][lo:hi] = mom[lo:hi]

    def _restore_rows(
        self,
        saved: dict[str, torch.Tensor],
        saved_momentum: dict[tuple[int, str], torch.Tensor],
        opts: list[torch.optim.Optimizer],
        param_names: list[list[str]],
        lo: int,
    ) -> None:
        with torch.no_grad():
            for n, buf in saved.items():
                self.state[n][lo:] = buf[lo:]
            for key, mom in self._momentum(opts, param_names):
                if key in saved_momentum:
                    mom[lo:] = saved_momentum[key][lo:]


def _setting_names(group: dict[str, Any]) -> tuple[str, ...]:
    """The names of a param group's hashable settings (its learning rate, momentum, ...): the Python values a
    graph of its optimizer's step reads."""
    return tuple(k for k, v in group.items() if k != "params" and isinstance(v, Hashable))


def _settings(opt: torch.optim.Optimizer) -> tuple[tuple[str, Any], ...]:
    """An optimizer's hashable settings, named (`_setting_names`)."""
    group = opt.param_groups[0]
    return tuple((k, group[k]) for k in _setting_names(group))


def _slices_step(opt: torch.optim.Optimizer, names: list[str], state: dict[str, torch.Tensor]) -> bool:
    """Whether `_ChunkRun._mixed_step` can update rows of the stack alone as `opt.step()` would: `opt` is
    SGD with one param group, without differentiable or fused updates, and its momentum buffers (if any)
    exist (SGD's first step makes them; `_mixed_step` writes into rows of them)."""
    if type(opt) is not torch.optim.SGD or len(opt.param_groups) != 1:
        return False
    group = opt.param_groups[0]
    if group.get("differentiable") or group.get("fused"):
        return False
    return group["momentum"] == 0 or all(
        isinstance(opt.state.get(state[n], {}).get("momentum_buffer"), torch.Tensor) for n in names
    )


def _rows_step(
    ws: Workspace,
    loss: Callable[..., torch.Tensor],
    rest_dims: dict[str, int | None],
    tr: dict[str, torch.Tensor],
    rest: dict[str, torch.Tensor],
    flags: dict[str, torch.Tensor],
    lo: int,
    hi: int,
    k: int,
) -> Callable[..., Any]:
    """The eager batched step of clients lo:hi of a stack of k: on views of their rows of the trained
    tensors `tr`, of the stacked ones of `rest` (client dimension 0 in `rest_dims`; the others whole) and
    of the flags."""
    whole = lo == 0 and hi == k

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t if whole else t[lo:hi]

    tr_rows = {n: rows(t) for n, t in tr.items()}
    rest_rows = {n: rows(t) if rest_dims[n] == 0 else t for n, t in rest.items()}
    flag_rows = {n: rows(f) for n, f in flags.items()}
    return lambda xb, yb: compiled.batched_grads(ws, loss, rest_dims, tr_rows, rest_rows, xb, yb, flag_rows)


class _Step:
    """One update's batched step on a chunk: eager on a slice of clients, or (runtime.compile)
    compiled on the whole stack."""

    def __init__(self, run: _ChunkRun, update: Update, trained: list[str], where: tuple[int, int]):
        if run.arena is not None:  # a closure over the round's tensors runs on the arena's copies of them
            update = dataclasses.replace(update, loss=run.arena.loss(where, update.loss))
        self.run, self.update, self.trained, self.where = run, update, trained, where
        # what keys its loss in its graphs (graph_arena); no graphs, no key
        self.loss_holds = loss_holds(update.loss) if run.arena is not None else ()
        # the patterns of runs whose steps replay graphs of their own (`_ChunkRun._graphed_runs`)
        self.graphed_runs: set[tuple[tuple[int, int, int], ...]] = set()
        trained_set = set(trained)
        self.rest_names = [n for n in run.state if n not in trained_set]
        self.rest_dims = {n: run.stage_dims[n] for n in self.rest_names}
        self.compiled = self.whole = self.whole_run = None
        self.graphs: cuda_graphs.StepGraphs | None = None
        if run.arena is not None:  # whole steps as CUDA graphs (`graphed`), the other steps eager
            self.graphs = run.arena.graphs(where)
        elif run.compile_steps:
            key = self.key = compiled.step_key(update.loss, *where)
            if run.device.type == "cpu":
                self.whole = compiled.compiled(compiled.batched_sgd_step, key, run.device)
                self.whole_run = compiled.compiled(
                    compiled.batched_sgd_step_run, key, run.device, compiled.small_step_options(run.device)
                )
            self.compiled = compiled.compiled(compiled.batched_grads, key, run.device)
        self.probes: ProbePlan | None = None  # the whole step's linear probes, found at its first call
        # `graphed`'s optimizer and the names of its hashable settings (`_setting_names`), found once per optimizer
        self._opt_setting_names: tuple[torch.optim.Optimizer, tuple[str, ...]] | None = None

    def steps_per_call(self, rows: torch.Tensor, opt: torch.optim.Optimizer) -> int:
        """How many whole steps (`whole_step`) one compiled call runs: `compiled.steps_per_call` of the
        chunk's clients and one client's step size (client 0's forward and backward on its first batch of
        `rows`, measured once per workspace and step key); 1 where no whole step runs."""
        run = self.run
        if self.whole is None or not run.fused_sgd(opt):
            return 1
        sizes = run.ws.client_step_sizes
        if self.key not in sizes:
            sizes[self.key] = compiled.client_step_size(
                run.ws,
                self.update.loss,
                self.trained,
                run.stage_state,
                run.stage_dims,
                run.x[rows[0]],
                run.y[rows[0]],
                run.flags,
            )
        return compiled.steps_per_call(sizes[self.key], run.k)

    def __call__(self, lo: int, hi: int) -> Callable[..., Any]:
        """The eager step of clients lo:hi (views of their rows)."""
        run = self.run
        return _rows_step(
            run.ws,
            self.update.loss,
            self.rest_dims,
            {n: run.state[n] for n in self.trained},
            {n: run.stage_state[n] for n in self.rest_names},
            run.flags,
            lo,
            hi,
            run.k,
        )

    def graphed(
        self, rows: torch.Tensor, opt: torch.optim.Optimizer, runs: tuple[tuple[int, int, int], ...] | None = None
    ) -> Any:
        """The stack's step on (K, batch) rows as a CUDA graph (`cuda_graphs.StepGraphs`): the eager step's
        gradients (`batched_grads`, set as the gradients) and `opt.step()`, captured together and replayed,
        whatever the optimizer's settings. Returns each client's loss.

        Without `runs`, the whole stack's step, used where every active client has a full batch; rows of
        clients past their last batch (fed padding rows) are stepped too, their stacked buffers (BatchNorm
        statistics) written too, and all of it restored with the epoch's other stale rows (`_save_rows`
        saved every stacked tensor when they finished).

        With `runs` ((lo, hi, batch size) of the active clients, `_ChunkRun._runs`), the eager step of a
        step where some batches are shorter, one graph per pattern of runs: each run's gradients on its
        rows, zero elsewhere, then `opt.step()`; returns each run's losses. Used where a pattern recurs
        (`_ChunkRun._graphed_runs`).

        The graphs are kept across rounds (`graph_arena.RoundArena`): the step's closures read the objects
        of this call (taken here, not through the chunk run at replay), and its loss is keyed by
        `graph_arena.loss_holds`."""
        run = self.run
        assert self.graphs is not None
        # what the step reads, as this call finds it (a graph kept for later rounds reads these tensors)
        ws, loss_fn, rest_dims, x, y, k = run.ws, self.update.loss, self.rest_dims, run.x, run.y, run.k
        tr = {n: run.state[n] for n in self.trained}
        rest = {n: run.stage_state[n] for n in self.rest_names}
        flags = dict(run.flags)

        def whole(rows: torch.Tensor) -> torch.Tensor:
            grads, loss = compiled.batched_grads(ws, loss_fn, rest_dims, tr, rest, x[rows], y[rows], flags)
            for n, t in tr.items():
                t.grad = grads[n]
            opt.step()
            return loss

        def by_runs(rows: torch.Tensor) -> list[torch.Tensor]:
            assert runs is not None
            grads = {n: torch.zeros_like(t) for n, t in tr.items()}
            losses = []
            for lo, hi, size in runs:
                idx = rows[lo:hi, :size]
                run_grads, loss = _rows_step(ws, loss_fn, rest_dims, tr, rest, flags, lo, hi, k)(x[idx], y[idx])
                for n, g in grads.items():
                    g[lo:hi] = run_grads[n]
                losses.append(loss)
            for n, t in tr.items():
                t.grad = grads[n]
            opt.step()
            return losses

        momentum = tuple(opt.state.get(t, {}).get("momentum_buffer") for t in tr.values())
        holds = (*self.loss_holds, opt, x, y, *tr.values(), *rest.values(), *flags.values(), *momentum)
        group = opt.param_groups[0]
        if self._opt_setting_names is None or self._opt_setting_names[0] is not opt:
            self._opt_setting_names = (opt, _setting_names(group))
        settings = tuple(group[k] for k in self._opt_setting_names[1])
        values = (settings, ws.mode_key, runs)  # the Python values the step reads: the rate, momentum, modes...
        # a new optimizer's first step makes its momentum buffers, which a graph must find made: run eagerly
        eager_first = group["momentum"] != 0 and any(m is None for m in momentum)
        return self.graphs.run(holds, rows, whole if runs is None else by_runs, values, warm_up=eager_first)

    def prefix(self, hi: int, xb: torch.Tensor, yb: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The compiled step of the whole stack on (K, batch) rows, for clients 0:hi: the caller keeps
        the gradients and losses of rows 0:hi; rows from hi on (clients past their last full batch,
        fed padding rows) leave their buffers unchanged, since their forward writes into copies."""
        run = self.run
        assert self.compiled is not None
        tr = {n: run.state[n] for n in self.trained}
        with run.kept_buffers(hi) as copies:
            rest = {**{n: run.stage_state[n] for n in self.rest_names}, **copies}
            compiled.before_call(run.device)
            return self.compiled(run.ws, self.update.loss, self.rest_dims, tr, rest, xb, yb, run.flags)

    def whole_step(self, hi: int, rows: torch.Tensor, opt: torch.optim.Optimizer) -> torch.Tensor:
        """The compiled whole step (CPU, plain SGD: see `_ChunkRun.fused_sgd`) of the stack on (K, batch) rows when
        clients 0:hi train and every one has a full batch: gradients and `opt`'s update in one call.
        Rows from hi on (clients past their last batch, fed padding rows) are updated too, and
        restored with the epoch's other stale rows; their stacked buffers (BatchNorm statistics) are
        kept as they were. Returns each client's loss. With (steps, K, batch) rows, those steps in turn in one
        call (`compiled.batched_sgd_step_run`), returning (steps, K) losses."""
        run = self.run
        assert self.whole is not None
        params, lr, settings = run.sgd_inputs(opt)
        tr = dict(zip(self.trained, params))
        if self.probes is None:
            self.probes = run.probe_plan(self.key, self.update, self.trained, rows if rows.dim() == 2 else rows[0])
        with run.kept_buffers(hi) as copies, end_probes_on_error(run.ws):
            rest = {**{n: run.stage_state[n] for n in self.rest_names}, **copies}
            fn = self.whole if rows.dim() == 2 else self.whole_run
            assert fn is not None  # compiled together with self.whole
            return fn(
                run.ws,
                self.update.loss,
                self.rest_dims,
                tr,
                rest,
                run.x,
                run.y,
                rows,
                run.flags,
                lr,
                settings,
                self.probes,
            )


class _StageStep:
    """All the updates of a stage's lockstep step in one compiled call (`compiled.batched_sgd_steps`:
    CPU, plain SGD at one learning rate (`_ChunkRun.fused_sgd_all`), steps where every active client has a
    full batch): the same
    gradients and updates as one `_Step.whole_step` per update, with one call's overhead a step (Ditto
    0.95-1.1 s a fedfcd-t1 round as two calls, 0.62-0.71 s as one). The workspace runs with every
    BatchNorm tracking its statistics; the statistics an update freezes reach it as copies."""

    def __init__(
        self, run: _ChunkRun, stage: Stage, param_names: list[list[str]], s: int, opts: list[torch.optim.Optimizer]
    ):
        for opt, names in zip(opts, param_names):  # the optimizers step the stack's own tensors
            assert all(p is run.state[n] for p, n in zip(run.sgd_inputs(opt)[0], names))
        self.run, self.updates = run, stage.updates
        self.trained = tuple(tuple(names) for names in param_names)
        # the workspace's modes for the call: every BatchNorm tracking; each update's frozen ones get
        # copies of their statistics (compiled.batched_sgd_steps)
        self.tracking = dataclasses.replace(stage.updates[0], frozen_stats=())
        self.frozen = tuple(
            tuple(n for n in run.ws.frozen_buffer_names(u.frozen_stats) if n in run.state) for u in stage.updates
        )
        self.keys = tuple(compiled.step_key(u.loss, s, i) for i, u in enumerate(stage.updates))
        self.fn = compiled.compiled(compiled.batched_sgd_steps, self.keys, run.device)
        self.probes: tuple[ProbePlan, ...] | None = None  # each update's linear probes, found at the first call

    def whole_step(self, hi: int, rows: torch.Tensor, opts: list[torch.optim.Optimizer]) -> list[torch.Tensor]:
        """Every update on the stack's (K, batch) rows when clients 0:hi train (rows from hi on as in
        `_Step.whole_step`: updated, restored at the epoch's end; their stacked buffers kept).
        Returns each update's per-client loss."""
        run = self.run
        _, lr, settings = run.sgd_inputs(opts[0])
        if self.probes is None:
            self.probes = tuple(
                run.probe_plan(key, u, names, rows) for key, u, names in zip(self.keys, self.updates, self.trained)
            )
        with run.kept_buffers(hi) as copies, end_probes_on_error(run.ws):
            state = {**run.stage_state, **copies} if copies else run.stage_state
            return self.fn(
                run.ws,
                tuple(u.loss for u in self.updates),
                self.trained,
                self.frozen,
                run.stage_dims,
                state,
                run.x,
                run.y,
                rows,
                run.flags,
                lr,
                settings,
                self.probes,
            )

"""The population executor: C configs x K sampled clients trained as one batched model.

A population is C configs of one method that differ only in fusible values (`autofl.config.FUSIBLE`:
fl.lr, fl.momentum, fl.weight_decay, fl.lr_decay and the method's fusible parameters). Configs that
agree on everything else sample the same clients, cut them into the same batches and run the same
step language, so their rounds' local training can be one lockstep run of the vectorized executor
(`autofl.accel.vectorized`) over rows that are (config, client) pairs:

- Rows are client-major: client k of the round's sorted order (batches, then last batch size,
  descending) holds rows k*C .. k*C + C-1, one per config. The vectorized executor's invariants
  (the clients still training are a prefix of the stack; clients with the same batch size at a
  step form contiguous runs) hold for the rows, since a client's C rows have the same batches.
- Each row starts from its own config's state (its global model, its copies, its flags), and its
  config's fusible method parameters reach the losses as per-row flags (`flags["method.<name>"]`,
  read through `Method.fused`).
- The optimizer (`RowSGD`) steps each config's rows (rows c, c+C, ...) with that config's SGD
  settings, all rows at once with the settings as per-row tensors, rounding as
  `torch.optim.SGD.step` rounds each config alone; when every config has the same settings, the
  whole stack by `torch.optim.sgd.sgd`, the function that step runs, as the vectorized executor does.

Every row's arithmetic is that of the same client in its config's own vectorized run, so in float64
a member's states and metrics equal its solo run's (tests/test_population.py).

On CPU with `compile_steps` the steps are the vectorized executor's compiled ones (`autofl.accel.compiled`):
where no member has momentum or weight decay, the whole step with its SGD update is one compiled call, the
update taking each row's rate as a (rows,) tensor (`_PopulationRun.sgd_inputs`), so the members' rates are
inputs of the graph, never constants; elsewhere the gradients are compiled and `RowSGD` steps eagerly. A
member's run then equals its run alone compiled (tests/test_population.py). On CUDA populations run eagerly.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.func import functional_call
from torch.optim.sgd import sgd as sgd_update  # the functional SGD that torch.optim.SGD.step runs

from autofl.accel.vectorized import _ChunkRun
from autofl.engine.executor import ClientJob, ClientOutcome, RoundPlan, Workspace, batch_cuts, outputs_by_slices
from autofl.engine.plan import ClientStart, Stage

# the settings of plain SGD a compiled whole step runs with a rate per row (`_PopulationRun.sgd_inputs`)
PLAIN_SGD: dict[str, Any] = {
    "weight_decay": 0.0,
    "momentum": 0.0,
    "dampening": 0.0,
    "nesterov": False,
    "maximize": False,
}


@dataclass(frozen=True)
class SGDSettings:
    lr: float
    momentum: float
    weight_decay: float


@dataclass
class Member:
    """One config's round: its plan (its learning rate this round, its SGD settings), its sampled
    clients' jobs, and its fusible method parameters as flags (`"method.<name>"` -> value).
    `step_key`: members whose local step may differ (a method whose step depends on the round, for
    members at different rounds) carry different keys; members of equal keys run one step program."""

    plan: RoundPlan
    jobs: list[ClientJob]
    flags: dict[str, float]
    step_key: Hashable = None


class RowSGD:
    """SGD over stacked tensors whose rows belong to C configs (row r to config r % C), each config's
    rows stepped with its own settings, exactly as `torch.optim.SGD` steps them alone.

    Where the configs' settings differ, every row is stepped at once with its config's learning rate,
    weight decay and momentum as per-row tensors: `torch.addcmul` with a per-row factor rounds as
    `Tensor.add(other, alpha=factor)` does (the single-tensor SGD's `grad.add(param, alpha=wd)`,
    `param.add_(grad, alpha=-lr)`), and a buffer that starts at zero takes SGD's first step (the buffer
    is the gradient) as `0 * m + grad`; so a config's rows get, bit for bit, the update SGD gives them
    alone (tests/test_population.py), in a constant number of kernels per tensor whatever C is. A row
    of a config without momentum keeps a buffer it never reads (0 * buffer + gradient)."""

    def __init__(self, params: list[torch.Tensor], settings: list[SGDSettings]):
        self.params = params
        self.settings = settings
        self.members = len(settings)
        self.uniform = len(set(settings)) == 1
        self.momentum = any(s.momentum != 0 for s in settings)
        self.weight_decay = any(s.weight_decay != 0 for s in settings)
        self.buffers: list[torch.Tensor | None] = [None] * len(params)  # momentum, made at the first step
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # by the tensors' rank

    def _per_row(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(-lr, weight decay, momentum) of each row of `p`, shaped to broadcast over its other dims."""
        if p.dim() not in self.factors:
            shape = (p.shape[0], *([1] * (p.dim() - 1)))
            reps = -(-p.shape[0] // self.members)

            def column(values: list[float]) -> torch.Tensor:
                rows = torch.tensor(values, dtype=p.dtype, device=p.device).repeat(reps)[: p.shape[0]]
                return rows.reshape(shape)

            self.factors[p.dim()] = (
                column([-s.lr for s in self.settings]),
                column([s.weight_decay for s in self.settings]),
                column([s.momentum for s in self.settings]),
            )
        return self.factors[p.dim()]

    def step(self) -> None:
        with torch.no_grad():
            for i, p in enumerate(self.params):
                grad = p.grad
                assert grad is not None  # the executor sets every trained tensor's gradient before a step
                if self.uniform:
                    self._step_uniform(i, p, grad)
                    continue
                neg_lr, weight_decay, momentum = self._per_row(p)
                if self.weight_decay:  # SGD adds no term where the decay is 0 (0 * p would be NaN at an inf)
                    grad = torch.addcmul(grad, p, weight_decay)
                if self.momentum:
                    buf = self.buffers[i]
                    if buf is None:
                        buf = self.buffers[i] = torch.zeros_like(p)
                    buf.mul_(momentum).add_(grad)
                    grad = buf
                p.addcmul_(grad, neg_lr)

    def _step_uniform(self, i: int, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Every row with the one config's settings: the function `torch.optim.SGD.step` runs."""
        s = self.settings[0]
        buffers: list[torch.Tensor | None] = [self.buffers[i]]
        sgd_update(
            [p],
            [grad],
            buffers,
            foreach=False,
            weight_decay=s.weight_decay,
            momentum=s.momentum,
            lr=s.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        self.buffers[i] = buffers[0]  # SGD's first step makes the buffer (the gradient)

    def momentum_buffers(self) -> list[torch.Tensor | None]:
        return self.buffers


class _PopulationRun(_ChunkRun):
    """The vectorized executor's chunk run over (config, client) rows, with `RowSGD` as each update's
    optimizer."""

    def __init__(
        self,
        ws: Workspace,
        plan: RoundPlan,
        jobs: list[ClientJob],
        x: torch.Tensor,
        y: torch.Tensor,
        settings: list[SGDSettings],
        compile_steps: bool = False,
    ):
        self.settings = settings
        self.pooled_x = x  # the pooled data (a stage with a table of inputs reads the table instead)
        self._row_lr: torch.Tensor | None = None  # each row's member's rate, for the compiled whole steps
        super().__init__(ws, plan, jobs, x, y, compile_steps)
        # CUDA graphs step torch.optim.SGD's state and param groups, which RowSGD has not
        assert not self.graph_steps, "population steps compile on CPU only (population_compile)"

    # ----- the compiled whole steps' SGD (CPU), per member ----------------------------------------
    def fused_sgd(self, opt: torch.optim.Optimizer) -> bool:
        """A compiled whole step runs a `RowSGD` update where no member has momentum or weight decay; each
        row's rate is a tensor (`sgd_inputs`), so members' rates never recompile the step."""
        row_sgd = cast(RowSGD, opt)
        return not row_sgd.momentum and not row_sgd.weight_decay

    def fused_sgd_all(self, opts: list[torch.optim.Optimizer]) -> bool:
        return all(self.fused_sgd(o) for o in opts)  # every update's RowSGD has the members' settings

    def sgd_inputs(self, opt: torch.optim.Optimizer) -> tuple[list[torch.Tensor], torch.Tensor, dict[str, Any]]:
        """The tensors `opt` steps, the rate of each row (row r member r % C's; a tensor even where the
        members share their rate, so a population's step compiles one variant whatever its members' rates)
        and plain SGD's other settings."""
        row_sgd = cast(RowSGD, opt)
        if self._row_lr is None:
            params = row_sgd.params[0]
            lrs = torch.tensor([s.lr for s in self.settings], dtype=params.dtype, device=params.device)
            self._row_lr = lrs.repeat(-(-self.k // len(lrs)))[: self.k]
        return row_sgd.params, self._row_lr, dict(PLAIN_SGD)

    # ----- a stage's `inputs` computed ahead (`_ChunkRun._inputs_table`), per member -----------------
    def _inputs_table(self, stage: Stage, module: torch.nn.Module) -> torch.Tensor | None:
        """The stage's inputs table of every member: member c's in rows c*N .. c*N + N-1 (N pooled rows),
        each computed as its run alone computes its own: one call over all of the member's rows where
        its clients all hold the received weights of the module, else one call per client. The stage's
        steps then read member c's rows at an offset of c*N (`_batch_rows`, `_run_stage`)."""
        c, n = len(self.settings), len(self.pooled_x)
        idx = [job.train_idx.to(self.device) for job in self.jobs]
        for m in range(c):
            every = torch.cat(idx[m::c])
            if not len(every) or len(every.unique()) < len(every):
                return None  # as a run alone: its losses compute the module batch by batch
        prefix = f"{stage.inputs}."
        state, dims = self._read_view()
        names = [name for name in state if name.startswith(prefix)]
        table: torch.Tensor | None = None
        for m in range(c):
            rows = list(range(m, self.k, c))
            received = all(self._received(name, rows) for name in names)
            calls = [(rows[0], torch.cat([idx[i] for i in rows]))] if received else [(i, idx[i]) for i in rows]
            for i, pooled_rows in calls:
                if not len(pooled_rows):
                    continue
                weights = {name[len(prefix) :]: state[name][i] if dims[name] == 0 else state[name] for name in names}
                outputs = outputs_by_slices(
                    lambda xs: functional_call(module, weights, (xs,)),  # noqa: B023 - called in this iteration
                    self.x,
                    pooled_rows,
                )
                if table is None:
                    table = outputs.new_zeros(c * n, *outputs.shape[1:])
                table.index_copy_(0, pooled_rows + m * n, outputs)
        return table

    def _received(self, name: str, rows: list[int]) -> bool:
        """Whether the stack's rows `rows` (one member's clients) all still hold one received tensor
        `name`: all started from the same tensor, and no stage has trained or overwritten it."""
        if name in self.touched:
            return False
        model, key = name.split(".", 1)
        first = self.jobs[rows[0]].start.models[model][key]
        return all(self.jobs[i].start.models[model][key] is first for i in rows)

    def _run_stage(self, s: int, stage: Stage) -> None:
        if self.x is self.pooled_x:
            super()._run_stage(s, stage)
            return
        pooled_y, self.y = self.y, self.y.repeat(len(self.settings))  # the table's rows: members' labels
        try:
            super()._run_stage(s, stage)
        finally:
            self.y = pooled_y

    def _batch_rows(self, s: int, e: int, max_steps: int) -> torch.Tensor:
        rows = super()._batch_rows(s, e, max_steps)
        if self.x is self.pooled_x:
            return rows
        c, n = len(self.settings), len(self.pooled_x)
        offsets = torch.arange(self.k, device=rows.device) % c * n
        return rows + offsets[None, :, None]

    def _optimizer(self, key: tuple[int, int], names: list[str]) -> RowSGD:  # type: ignore[override]
        return RowSGD([self.state[n] for n in names], self.settings)

    def _momentum(
        self, opts: list[torch.optim.Optimizer], param_names: list[list[str]]
    ) -> Iterator[tuple[tuple[int, str], torch.Tensor]]:
        for u, (opt, names) in enumerate(zip(opts, param_names)):
            for n, buf in zip(names, cast(RowSGD, opt).momentum_buffers()):
                if buf is not None:
                    yield (u, n), buf


class PopulationExecutor:
    """Trains the rounds of C members together (`train`); the workspace is any member's (all have
    the same layout, and the losses are the first member's, which read per-member values from flags)."""

    name = "population"

    def __init__(self, ws: Workspace, compile_steps: bool = False):
        self.ws = ws
        self.compile_steps = compile_steps  # CPU: the vectorized executor's compiled steps (`autofl.accel.compiled`)

    def train(self, members: list[Member], x: torch.Tensor, y: torch.Tensor) -> list[list[ClientOutcome]]:
        """Each member's outcomes, in the order of its jobs. Members that sample the same clients with the
        same batch size and local epochs, and carry the same `step_key`, train together as one batched
        run (`fused_groups`); each such group is one run, one after another."""
        out: list[list[ClientOutcome]] = [[] for _ in members]
        for group in fused_groups(members):
            for i, outcomes in zip(group, self._train_group([members[i] for i in group], x, y)):
                out[i] = outcomes
        return out

    def _train_group(self, members: list[Member], x: torch.Tensor, y: torch.Tensor) -> list[list[ClientOutcome]]:
        """Members that sample the same clients on the same rows with the same batch size and local
        epochs (configs that differ only in fusible values, at rounds whose steps agree) as one run."""
        first = members[0]
        if not first.jobs:
            return [[] for _ in members]
        bs = first.plan.batch_size
        sizes = [[b - a for a, b in batch_cuts(len(job.train_idx), bs)] for job in first.jobs]
        order = sorted(range(len(first.jobs)), key=lambda i: (-len(sizes[i]), -(sizes[i][-1] if sizes[i] else 0)))
        rows: list[ClientJob] = []
        for k in order:
            for m in members:
                job = m.jobs[k]
                start = ClientStart(job.start.models, {**job.start.flags, **m.flags})
                rows.append(ClientJob(job.cid, start, job.train_idx, job.generator))
        settings = [SGDSettings(m.plan.lr, m.plan.momentum, m.plan.weight_decay) for m in members]
        outcomes = _PopulationRun(self.ws, first.plan, rows, x, y, settings, self.compile_steps).run()
        c = len(members)
        out: list[list[ClientOutcome | None]] = [[None] * len(first.jobs) for _ in members]
        for position, k in enumerate(order):
            for member in range(c):
                out[member][k] = outcomes[position * c + member]
        for m in members:
            m.plan.finished(len(m.jobs))
        return [[o for o in member if o is not None] for member in out]


def fused_groups(members: list[Member]) -> list[list[int]]:
    """Indices of `members` in groups that can train as one batched run: the same sampled clients (in
    order), batch size, local epochs and `step_key`; groups in order of their first member."""
    groups: dict[Hashable, list[int]] = {}
    for i, m in enumerate(members):
        key = (tuple(j.cid for j in m.jobs), m.plan.batch_size, m.plan.local_epochs, m.step_key)
        groups.setdefault(key, []).append(i)
    return list(groups.values())

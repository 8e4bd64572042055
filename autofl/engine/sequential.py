"""The sequential executor: one client after another, on the workspace's own modules.

Each client's states are loaded into the workspace (`load_state_dict`, no copies of modules),
each update steps its own `torch.optim.SGD` over the module parameters it trains. This is the
reference executor: the faster ones (autofl.accel) are held equal to it by the tests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

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
from autofl.engine.state import clone_state


class SequentialExecutor:
    name = "sequential"

    compile_steps = False  # its steps run eager (autofl.accel.compiled_sequential compiles them)

    def __init__(self, ws: Workspace):
        self.ws = ws

    def train(self, plan: RoundPlan, jobs: list[ClientJob], x: torch.Tensor, y: torch.Tensor) -> list[ClientOutcome]:
        outcomes = []
        for job in jobs:
            outcomes.append(self.train_client(plan, job, x, y))
            plan.finished(1)
        return outcomes

    def train_client(self, plan: RoundPlan, job: ClientJob, x: torch.Tensor, y: torch.Tensor) -> ClientOutcome:
        ws = self.ws
        for name in ws.model_names():
            ws.get_submodule(name).load_state_dict(job.start.models[name])
        flags = {k: flag_tensor(v, x.dtype, x.device) for k, v in job.start.flags.items()}
        totals: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        for s, (stage, orders) in enumerate(zip(plan.stages, epoch_orders(job, plan))):
            table, where = self._inputs(stage, job, x)
            if where is None:
                stage = losses_on_inputs(stage)
            losses = [self._loss_fn(update, (s, u), plan.batch_size) for u, update in enumerate(stage.updates)]
            trained = stage_models(stage)
            trainable = set(ws.param_names(tuple(p for u in stage.updates for p in u.trains)))
            for name, p in ws.named_parameters():
                p.requires_grad_(name in trainable)
            params = [[p for name, p in ws.named_parameters() if name.startswith(u.trains)] for u in stage.updates]
            opts = [plan.optimizer(ps) for ps in params]
            # one update: its parameters are the only ones requiring grad, modes are set once per epoch
            alternating = len(stage.updates) > 1
            for key in {u.report for u in stage.updates if u.report is not None}:
                totals.setdefault(key, torch.zeros((), dtype=x.dtype, device=x.device))
            for order in orders:
                if not alternating:
                    ws.enter(trained, stage.updates[0])
                for a, b in batch_cuts(len(order), plan.batch_size):
                    idx = order[a:b]
                    xb, yb = table[idx if where is None else where[idx]], y[idx]
                    for update, loss_fn, ps, opt in zip(stage.updates, losses, params, opts):
                        if alternating:
                            ws.enter(trained, update)
                        loss = loss_fn(xb, yb, flags)
                        opt.zero_grad(set_to_none=True)
                        loss.backward(inputs=ps if alternating else None)
                        opt.step()
                        if update.report is not None:
                            totals[update.report] += loss.detach() * (b - a)
                            counts[update.report] = counts.get(update.report, 0) + (b - a)
                ws.leave()
                for target, source in stage.snapshot_after_epoch.items():
                    ws.get_submodule(target).load_state_dict(ws.get_submodule(source).state_dict())
                for key, value in stage.flags_after_epoch.items():
                    flags[key] = torch.tensor(value, dtype=x.dtype, device=x.device)
        for p in ws.parameters():
            p.grad = None
        ws.leave()
        mean_losses = {key: float(totals[key]) / max(counts.get(key, 0), 1) for key in totals}
        mean_losses.setdefault("loss", 0.0)
        return ClientOutcome(clone_state(ws.model), mean_losses)

    def _inputs(self, stage: Stage, job: ClientJob, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the stage's batches are cut from: the pooled data (and None), or, for a stage whose `inputs`
        module is computed ahead (`stage_inputs`), its outputs on all of the client's rows and each pooled
        row's position among them."""
        module = stage_inputs(self.ws, stage)
        if module is None:
            return x, None
        outputs = outputs_by_slices(module, x, job.train_idx)
        where = torch.zeros(len(x), dtype=torch.int64, device=x.device)
        where[job.train_idx] = torch.arange(len(job.train_idx), device=x.device)
        return outputs, where

    def _loss_fn(self, update: Update, where: tuple[int, int], batch_size: int) -> Callable[..., torch.Tensor]:
        """loss(x, y, flags) of one update (stage and update index `where`) on the workspace, eager."""
        ws = self.ws
        return lambda xb, yb, flags: update.loss(ws, xb, yb, flags)

"""The sequential executor with `runtime.compile`: each update's forward and loss (and, through
AOTAutograd, its backward) compiled for full batches (`compiled.client_loss`); a smaller last
batch runs eager. Everything else is the reference executor's (autofl.engine.sequential)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from autofl.accel import compiled
from autofl.engine.plan import Update
from autofl.engine.sequential import SequentialExecutor


class CompiledSequentialExecutor(SequentialExecutor):
    compile_steps = True

    def _loss_fn(self, update: Update, where: tuple[int, int], batch_size: int) -> Callable[..., torch.Tensor]:
        """loss(x, y, flags) of one update on the workspace, compiled for full batches of `batch_size`
        (one static shape); a smaller last batch runs eager."""
        ws = self.ws
        step = compiled.compiled(
            compiled.client_loss, compiled.step_key(update.loss, *where), next(ws.parameters()).device
        )

        def run(xb: torch.Tensor, yb: torch.Tensor, flags: dict[str, torch.Tensor]) -> torch.Tensor:
            if len(xb) != batch_size:
                return update.loss(ws, xb, yb, flags)
            compiled.before_call(xb.device)
            return step(ws, update.loss, xb, yb, flags)

        return run

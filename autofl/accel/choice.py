"""Which executor runs a trial: runtime.executor (auto | sequential | vectorized) and runtime.compile
resolved against the model and the device, with the line saying which and why. The simulation's
one entry into autofl.accel: every executor it returns is an `autofl.engine.executor.Executor`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autofl.accel.compiled import choose_compile
from autofl.accel.compiled_sequential import CompiledSequentialExecutor
from autofl.accel.vectorized import VectorizedExecutor
from autofl.device import resolve_device
from autofl.engine.executor import Executor, Workspace
from autofl.engine.sequential import SequentialExecutor
from autofl.engine.server import MethodClass
from autofl.errors import ConfigError

# module types whose forward is known to run under torch.func.vmap with per-client tensors
_VMAP_SAFE = (
    nn.Linear,
    nn.Conv2d,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.ReLU,
    nn.MaxPool2d,
    nn.AdaptiveAvgPool2d,
    nn.Flatten,
    nn.Identity,
    nn.Sequential,
)


def vectorizable(ws: Workspace) -> str | None:
    """None when the vectorized executor can run this workspace, else the reason it cannot."""
    for name, module in ws.named_modules():
        if not list(module.children()) and not isinstance(module, _VMAP_SAFE):
            return f"{name} ({type(module).__name__}) has no known batching rule"
    return None


def slower_vectorized(ws: Workspace, device: torch.device) -> str | None:
    """Why `auto` should not vectorize on this device, from measurements: on CPU, per-client
    convolutions batched by vmap become grouped convolutions, which ran slower than one client at a
    time (fmnist-cnn, 10 clients: DualFed 24.8 s vs 20.2 s a round). Linear-only models run 3-4x faster."""
    if device.type == "cpu" and any(isinstance(m, nn.Conv2d) for m in ws.model.modules()):
        return "convolutions on CPU train faster one client at a time"
    return None


def sequential(ws: Workspace, compile_steps: bool) -> SequentialExecutor:
    """The sequential executor, its steps compiled or eager (the reference executor)."""
    return CompiledSequentialExecutor(ws) if compile_steps else SequentialExecutor(ws)


def make_executor(
    choice: str,
    ws: Workspace,
    client_chunk: int | None,
    device: torch.device = torch.device("cpu"),
    compile_choice: str = "off",
    rounds: int = 1,
    steps_per_round: int | None = None,
) -> tuple[Executor, str]:
    """The executor for runtime.executor = `choice` and runtime.compile = `compile_choice` on
    `device` for a trial of `rounds` rounds of `steps_per_round` lockstep steps (None: not known
    yet), and a line saying which and why."""
    unsupported = vectorizable(ws) if choice != "sequential" else None
    if unsupported is not None and choice == "vectorized":
        raise ConfigError(
            f"runtime.executor: vectorized cannot run this model: {unsupported}; allowed here: auto, sequential"
        )
    blocker = unsupported or (slower_vectorized(ws, device) if choice == "auto" else None)
    vectorized = choice != "sequential" and blocker is None
    compile_steps, compile_why = choose_compile(
        compile_choice, device, rounds, "vectorized" if vectorized else "sequential", steps_per_round
    )
    steps = f"; steps: {'compiled' if compile_steps else 'eager'} ({compile_why})"
    if choice == "sequential":
        return sequential(ws, compile_steps), f"executor: sequential (runtime.executor=sequential){steps}"
    if vectorized:
        chunk = f", {client_chunk} clients per chunk" if client_chunk else ""
        return (
            VectorizedExecutor(ws, client_chunk, compile_steps),
            f"executor: vectorized (runtime.executor={choice}{chunk}){steps}",
        )
    return sequential(ws, compile_steps), f"executor: sequential (runtime.executor=auto: {blocker}){steps}"


def describe_executor(exp: Any, method_cls: MethodClass, device: torch.device | None = None) -> str:
    """The executor line `exp` will run with, without loading its data (for the search's banner);
    `method_cls` is `exp.method.name`'s class, resolved by the caller."""
    method = method_cls(exp.method.typed(method_cls.Params), exp, exp.input_shape, exp.num_classes)
    if device is None:
        device = resolve_device(exp.runtime.device)
    workspace = Workspace(method.build_model(), method_cls.copies)
    return make_executor(
        exp.runtime.executor, workspace, exp.runtime.client_chunk, device, exp.runtime.compile, exp.fl.rounds
    )[1]

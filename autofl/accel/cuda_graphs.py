"""CUDA graphs of the vectorized executor's whole steps (`runtime.compile` on CUDA).

On a GPU a lockstep step of a small model is all launch overhead: on an H200 (2026-11-26) an eager
step of fedfcd-t1's FedAvg (20 clients, batch 10, mlp) took 2.5 ms, dozens of small kernels each
issued from Python, for 1.3 us of arithmetic. A CUDA graph records the step's kernels once and
replays them with one launch (PyTorch's whole-step recipe: forward, backward and the optimizer's
`step()` captured together, with the batch's row indices copied into a static buffer first).

Measured there (docs/benchmarks.md, `scripts/bench_round.py --synthetic --device cuda --compile both`):
FedAvg's fedfcd-t1 round 0.726 s eager, 0.063 s with graphs; FedSiam-DA's 4.64 s, 0.557 s; cifar10-cnn
FedAvg 0.78 s, 0.37 s. A graphed FedAvg round is now bound by the host: its kernels ran 28 ms of a
profiled 109 ms round (torch.profiler), the rest is the executor's Python, a rows copy and a graph
launch each step. Graphs of several steps were tried and dropped: each round then captured anew, and a
graph's launch grows with its kernels (139 us for 4 steps), so 4 steps a graph made FedAvg's round 1.20x
slower and 16 left FedRep's (2,630 head steps a round) unchanged (1.01x; one-process A/B, medians of 3).

`StepGraphs.run(holds, rows, step, values, warm_up)` runs `step(rows)`, one step on the tensors it closes over:
- a graph is keyed by the identity of the objects `step` reads (`holds`: the stacked tensors, the
  flags, the loss closure, the optimizer and its momentum buffers), the Python values it reads
  (`values`: the optimizer's settings, the workspace's train/eval modes) and the rows' shape; it holds
  the objects, so no other object can take their identity while it lives;
- the first call, and a call with `warm_up` (the caller's new optimizer has no momentum buffers yet),
  runs `step` eagerly, on the capture stream: a real step (its effect is wanted) that also sets up
  what the stream needs before a capture (cuBLAS's handle and workspace) and creates the optimizer's
  momentum buffers, which the graphs then read and write in place;
- a later call with a new key captures `step` on a static copy of its rows (capturing records
  kernels and runs none), then replays it: the same kernels as the eager step, on the same memory,
  so the graph's steps equal eager ones;
- every call with a known key copies its rows into the static buffer and replays.

A graph replays only the kernels it recorded: a Python value `step` reads that is not in `values`
must not change between calls, and `step` must not synchronize with the host (`.item()`, a branch on a
tensor's value: `vmap`, which the executor's steps run under, rejects both anyway). A capture that
fails anyway (a custom loss that copies from host memory, say) is reported once as a warning, with the
step's own error, and the step runs eagerly from then on.

A step's graphs share one memory pool: a later capture may reuse memory an earlier graph's outputs
(its losses, the gradients it set) live in, so a graph's outputs are valid until the next replay of
any graph of the step. The executor copies the losses at once and sets the gradients anew each step.

`torch.cuda.CUDAGraph`'s own capture calls are used rather than the `torch.cuda.graph` context, which
runs `gc.collect()` and empties the allocator's cache at every capture: a round whose loss is a closure
made afresh captures again, and the collection alone would cost more than the round. The executor keeps
a step's `StepGraphs`, and the tensors its graphs read, from one round to the next (accel/graph_arena.py),
so a round with the same loss replays the graphs of the rounds before.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def graphs_on(device: torch.device) -> bool:
    """Whether runtime.compile replays the vectorized executor's whole steps as CUDA graphs on `device`
    (rather than compiling them): the one place `choose_compile` and the executor ask."""
    return device.type == "cuda"


# graphs one step keeps (its whole step's, one per pattern of shorter batches, a key replaced by a new round's
# loss or flags): the least recently used goes. A step's graphs share one memory pool, so more graphs cost
# their launch structures, not their activations again
MAX_GRAPHS = 32


class _Graph:
    def __init__(self, holds: tuple[Any, ...]):
        self.holds = holds  # keeps the keyed objects alive, so their ids stay theirs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.rows: torch.Tensor | None = None
        self.out: Any = None


class StepGraphs:
    """The CUDA graphs of one step function (see the module doc); one per executor step (a stage's update),
    kept across rounds (`graph_arena.RoundArena.graphs`)."""

    def __init__(self) -> None:
        self.graphs: collections.OrderedDict[Hashable, _Graph] = collections.OrderedDict()
        self.stream: torch.cuda.Stream | None = None  # made at the first call (`_capture_stream`)
        self.pool: Any = None  # one memory pool for this step's graphs (see the module doc)
        self.warmed = False  # the first call ran eagerly on the capture stream
        self.failed: str | None = None
        self.captures = self.replays = 0

    def run(
        self,
        holds: tuple[Any, ...],
        rows: torch.Tensor,
        step: Callable[[torch.Tensor], T],
        values: tuple[Hashable, ...] = (),
        warm_up: bool = False,
    ) -> T:
        if self.failed is not None:
            return step(rows)
        if not self.warmed or warm_up:
            self.warmed = True
            return self._on_stream(lambda: step(rows))
        key = (*map(id, holds), values, tuple(rows.shape), rows.dtype)
        entry = self.graphs.get(key)
        if entry is not None:
            self.graphs.move_to_end(key)
        else:
            entry = self.graphs[key] = _Graph(holds)
            if len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
            self._capture(entry, rows, step)
            if self.failed is not None:
                return step(rows)
        assert entry.graph is not None and entry.rows is not None
        entry.rows.copy_(rows)
        entry.graph.replay()
        self.replays += 1
        return entry.out

    def _capture_stream(self) -> torch.cuda.Stream:
        """The side stream the first call and the captures run on, with the graphs' memory pool: made at the
        first call, so a step that never runs on CUDA (or a stand-in that overrides `_on_stream` and
        `_capture`) makes neither."""
        if self.stream is None:
            self.stream, self.pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
        return self.stream

    def _on_stream(self, fn: Callable[[], T]) -> T:
        """`fn()` on the capture stream, ordered after and before the current stream's work."""
        stream, current = self._capture_stream(), torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            out = fn()
        current.wait_stream(stream)
        return out

    def _capture(self, entry: _Graph, rows: torch.Tensor, step: Callable[[torch.Tensor], T]) -> None:
        entry.rows = rows.clone()
        graph = torch.cuda.CUDAGraph()
        stream, current = self._capture_stream(), torch.cuda.current_stream()
        stream.wait_stream(current)
        error: Exception | None = None  # the first failure: the step's own, not the invalidated capture's
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=self.pool)
            try:
                entry.out = step(entry.rows)
            except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager steps
                error = err
            try:
                graph.capture_end()
            except Exception as err:  # noqa: BLE001
                error = error or err
        if error is not None:
            self.failed = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.graphs.clear()
            warnings.warn(
                f"runtime.compile: a step could not be captured as a CUDA graph ({self.failed}); it runs eagerly",
                RuntimeWarning,
                stacklevel=3,
            )
            torch.cuda.synchronize()
            return
        current.wait_stream(stream)
        entry.graph = graph
        self.captures += 1

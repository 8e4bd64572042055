"""engine/cuda_graphs.py's bookkeeping, on CPU: when a step runs eagerly, is captured, replayed or falls
back, with torch's CUDA graph calls replaced by a recorder that behaves like a graph (capturing records
the step's work and runs none of it; a replay runs what was recorded on the static rows buffer).
The graphs themselves are compared with eager steps on a GPU by
`tests/test_executor_equivalence.py::test_cuda_graph_steps_equal_eager` (AUTOFL_TEST_DEVICE=cuda)."""

from __future__ import annotations

import contextlib
from typing import Callable

import pytest
import torch

from autofl.engine import cuda_graphs


class FakeStream:
    def wait_stream(self, other: object) -> None:
        pass


class FakeGraph:
    recording: "FakeGraph | None" = None  # the graph being captured, if any

    def __init__(self) -> None:
        self.work: list[Callable[[], None]] = []

    def capture_begin(self, pool: object = None) -> None:
        FakeGraph.recording = self

    def capture_end(self) -> None:
        FakeGraph.recording = None

    def replay(self) -> None:
        for kernel in self.work:
            kernel()


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    FakeGraph.recording = None


def summing_step(weight: torch.Tensor, fail_in_capture: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """A step that adds the sum of its rows to `weight` and returns the new weight (a fresh output tensor,
    as a step's losses are): run at once, or recorded while a graph captures."""

    def step(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(1)

        def kernel() -> None:
            weight.add_(rows.sum())
            out.copy_(weight)

        if FakeGraph.recording is not None:
            if fail_in_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            FakeGraph.recording.work.append(kernel)
        else:
            kernel()
        return out

    return step


def test_the_first_call_runs_eagerly_a_new_key_captures_once_then_replays_on_each_calls_rows(fake_cuda):
    graphs = cuda_graphs.StepGraphs()
    weight = torch.zeros(1)
    step = summing_step(weight)
    holds = (weight,)
    assert graphs.run(holds, torch.tensor([1.0, 2.0]), step).item() == 3  # eager warm-up: a real step
    assert (graphs.captures, graphs.replays) == (0, 0)
    # captured (recording runs nothing) and replayed once: the step's effect happens exactly once
    assert graphs.run(holds, torch.tensor([10.0, 0.0]), step).item() == 13
    assert (graphs.captures, graphs.replays) == (1, 1)
    # replayed on this call's rows, copied into the graph's static buffer
    out = graphs.run(holds, torch.tensor([100.0, 0.0]), step)
    assert out.item() == 113 and weight.item() == 113
    assert (graphs.captures, graphs.replays) == (1, 2)


def test_other_tensors_or_another_rows_shape_capture_their_own_graph(fake_cuda):
    graphs = cuda_graphs.StepGraphs()
    a, b = torch.zeros(1), torch.zeros(1)
    graphs.run((a,), torch.ones(2), summing_step(a))
    graphs.run((a,), torch.ones(2), summing_step(a))
    graphs.run((b,), torch.ones(2), summing_step(b))  # a new tensor (a new round's stack, say)
    graphs.run((a,), torch.ones(3), summing_step(a))  # another rows shape
    assert graphs.captures == 3 and a.item() == 2 + 2 + 3 and b.item() == 2
    graphs.run((a,), torch.ones(2), summing_step(a))  # known again: replayed
    assert graphs.captures == 3 and a.item() == 9


def test_only_the_latest_graphs_are_kept(fake_cuda, monkeypatch):
    monkeypatch.setattr(cuda_graphs, "MAX_GRAPHS", 2)
    graphs = cuda_graphs.StepGraphs()
    tensors = [torch.zeros(1) for _ in range(4)]
    graphs.run((tensors[0],), torch.ones(1), summing_step(tensors[0]))
    for t in tensors:
        graphs.run((t,), torch.ones(1), summing_step(t))
    assert len(graphs.graphs) == 2 and graphs.captures == 4
    graphs.run((tensors[0],), torch.ones(1), summing_step(tensors[0]))  # dropped: captured again
    assert graphs.captures == 5


def test_a_step_that_cannot_be_captured_warns_once_and_runs_eagerly_from_then_on(fake_cuda):
    graphs = cuda_graphs.StepGraphs()
    weight = torch.zeros(1)
    step = summing_step(weight, fail_in_capture=True)
    graphs.run((weight,), torch.ones(2), step)
    with pytest.warns(RuntimeWarning, match="could not be captured as a CUDA graph.*operation not permitted"):
        assert graphs.run((weight,), torch.ones(2), step).item() == 4  # the failed capture's call ran eagerly
    assert FakeGraph.recording is None and graphs.failed and not graphs.graphs
    assert graphs.run((weight,), torch.ones(2), step).item() == 6
    assert (graphs.captures, graphs.replays) == (0, 0)

"""accel/cuda_graphs.py's bookkeeping, on CPU: when a step runs eagerly, is captured, replayed or falls
back, with torch's CUDA graph calls replaced by a recorder that behaves like a graph (capturing records
the step's work and runs none of it; a replay runs what was recorded on the static rows buffer).
The graphs themselves are compared with eager steps on a GPU by
`tests/test_executor_equivalence.py::test_cuda_graph_steps_equal_eager` (AUTOFL_TEST_DEVICE=cuda)."""

from __future__ import annotations

import contextlib
from typing import Callable

import pytest
import torch

from autofl.accel import cuda_graphs


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


def test_other_tensors_another_rows_shape_or_other_values_capture_their_own_graph(fake_cuda):
    graphs = cuda_graphs.StepGraphs()
    a, b = torch.zeros(1), torch.zeros(1)
    graphs.run((a,), torch.ones(2), summing_step(a))
    graphs.run((a,), torch.ones(2), summing_step(a))
    graphs.run((b,), torch.ones(2), summing_step(b))  # a new tensor (a new round's stack, say)
    graphs.run((a,), torch.ones(3), summing_step(a))  # another rows shape
    assert graphs.captures == 3 and a.item() == 2 + 2 + 3 and b.item() == 2
    graphs.run((a,), torch.ones(2), summing_step(a))  # known again: replayed
    assert graphs.captures == 3 and a.item() == 9
    graphs.run((a,), torch.ones(2), summing_step(a), values=(0.5,))  # a Python value it reads changed
    assert graphs.captures == 4 and a.item() == 11


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


class ReplayingGraph:
    """A captured graph's stand-in on CPU: a replay runs the step as it was captured (its closure, with
    the objects of the capturing call) on the graph's static rows buffer."""

    def __init__(self, entry: "cuda_graphs._Graph", step: Callable[[torch.Tensor], torch.Tensor]):
        self.entry, self.step = entry, step

    def replay(self) -> None:
        self.entry.out = self.step(self.entry.rows)


class CpuStepGraphs(cuda_graphs.StepGraphs):
    """`StepGraphs` with its capture replaced by `ReplayingGraph`, so the executor's graph branch runs on CPU."""

    made: list["CpuStepGraphs"] = []

    def __init__(self) -> None:
        super().__init__()
        CpuStepGraphs.made.append(self)

    def _on_stream(self, fn):
        return fn()

    def _capture(self, entry, rows, step) -> None:
        entry.rows = rows.clone()
        entry.graph = ReplayingGraph(entry, step)
        self.captures += 1


@pytest.fixture
def cpu_graphs(monkeypatch) -> list[CpuStepGraphs]:
    """The executor's graph branch on CPU: `graphs_on` true and `StepGraphs` replaced by `CpuStepGraphs`;
    the list of the `CpuStepGraphs` the run made (empty at the start of each test)."""
    monkeypatch.setattr(cuda_graphs, "graphs_on", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "StepGraphs", CpuStepGraphs)
    CpuStepGraphs.made = []
    return CpuStepGraphs.made


@pytest.mark.parametrize("epochs", [1, 3])
@pytest.mark.parametrize("method,arch", [("fedavg", "mlp"), ("fedrep", "mlp"), ("fedsiam_da", "mlp"), ("ditto", "mlp"),
                                         ("moon", "moon_cnn")])
def test_the_executors_graph_steps_train_what_its_eager_steps_do(method, arch, epochs, cpu_graphs, monkeypatch):
    """The vectorized executor's graph branch (`_Step.graphed`, taken on CUDA under runtime.compile),
    run on CPU with `ReplayingGraph`: whole-stack steps wherever every active client has a full batch,
    clients past their last batch fed padding rows and stepped, then restored at the epoch's end (on a
    BatchNorm model only where all clients train), momentum and weight decay in the captured optimizer
    step, a stage's updates one graph each (FedSiam-DA, Ditto), FedRep's head epochs on stored encoder
    outputs. Steps where some clients have shorter batches: the full batches by the whole step's graph
    and the shorter ones eagerly on their rows (`_ChunkRun._mixed_step`), and in a stage of 3 epochs or
    more, from the second epoch on, a graph of the eager step per pattern of batch sizes (in a shorter
    stage, for a pattern met the round before). Tensors, optimizers and graphs are kept from round to round
    (accel/graph_arena.py; here 3 of 5 clients sampled a round). The run equals the eager one in float64
    on the uneven scenario, and graphs replayed.""" 
    from test_executor_equivalence import GRAPHED, assert_same_run, run

    from autofl.accel import vectorized

    mixed_steps, pattern_steps = [], []
    eager_patterns, graphed_unseen = set(), []  # patterns stepped without a graph of their own; graphed before that
    update = vectorized._ChunkRun._update
    mixed_step, graphed_step = vectorized._ChunkRun._mixed_step, vectorized._Step.graphed

    def mixed(self, update, names, step, opt, runs, rows):
        mixed_steps.append(runs)
        return mixed_step(self, update, names, step, opt, runs, rows)

    def graphed(self, rows, opt, runs=None):
        if runs is not None:
            pattern_steps.append(runs)
        return graphed_step(self, rows, opt, runs)

    def logged_update(self, update_, names, step, opt, runs, rows, active):
        graphed_before = len(pattern_steps)
        update(self, update_, names, step, opt, runs, rows, active)
        if len(pattern_steps) == graphed_before:
            eager_patterns.add(tuple(runs))
        elif tuple(runs) not in eager_patterns:
            graphed_unseen.append(tuple(runs))

    monkeypatch.setattr(vectorized._ChunkRun, "_update", logged_update)
    monkeypatch.setattr(vectorized._ChunkRun, "_mixed_step", mixed)
    monkeypatch.setattr(vectorized._Step, "graphed", graphed)
    extra = (*GRAPHED, f"fl.local_epochs={epochs}", *(["method.head_epochs=3"] if method == "fedrep" else []))
    eager_history, eager = run(method, arch, "vectorized", "float64", "off", extra)
    assert not cpu_graphs
    history, graphed_run = run(method, arch, "vectorized", "float64", "on", extra)
    assert_same_run(eager_history, eager, history, graphed_run)
    captured = sum(g.captures for g in cpu_graphs)
    assert captured >= 1 and sum(g.replays for g in cpu_graphs) > 2 * captured
    # steps with shorter last batches had their full batches stepped by the whole step's graph...
    assert mixed_steps and all(len(runs) > 1 for runs in mixed_steps)
    if epochs > 1 or method == "fedrep":  # ... and, from a long stage's second epoch, a graph of their own
        assert pattern_steps
    else:  # ... and in one-epoch stages, a graph of their own only for a pattern met eagerly the round before
        assert not graphed_unseen


@pytest.mark.parametrize("method", sorted(__import__("autofl.methods.registry", fromlist=["x"]).method_names()))
def test_graphs_are_kept_across_rounds_and_a_round_like_the_last_replays_them_all(method, cpu_graphs, monkeypatch):
    """With every client sampled each round, a round's steps meet the tensors, optimizers and patterns
    of the round before (accel/graph_arena.py): every method's run equals the eager one in float64 on
    the uneven scenario, and the third round runs no `vmap(grad)` outside a graph (no warm-up, and the
    patterns of shorter batches replay graphs of their own) and captures nothing: its losses are the
    last round's (a method's own `loss`, module-level losses, closures made again over the same
    values), and a closure over the round's own tensors (FedECCR's and FedProto's prototypes, FedFCD's
    GFR statistics) runs on the arena's copies of them (`RoundArena.loss`). FedProto's loss changes
    after round 1 (CE alone until there are prototypes), so its round 3 still captures the patterns
    that round 2 met."""
    from test_executor_equivalence import GRAPHED, assert_same_run, run

    from autofl.accel import compiled
    from autofl.engine import simulation

    eager_calls: list[int] = []  # batched_grads calls outside a replay, per round
    captures: list[int] = []  # graphs captured, per round
    replaying = [False]
    batched_grads, replay = compiled.batched_grads, ReplayingGraph.replay
    run_round = simulation.Simulation.run_round

    def counted(*a, **k):
        if not replaying[0]:
            eager_calls[-1] += 1
        return batched_grads(*a, **k)

    def replayed(self):
        replaying[0] = True
        try:
            replay(self)
        finally:
            replaying[0] = False

    def one_round(self):
        eager_calls.append(0)
        before = sum(g.captures for g in cpu_graphs)
        try:
            return run_round(self)
        finally:
            captures.append(sum(g.captures for g in cpu_graphs) - before)

    monkeypatch.setattr(compiled, "batched_grads", counted)
    monkeypatch.setattr(ReplayingGraph, "replay", replayed)
    monkeypatch.setattr(simulation.Simulation, "run_round", one_round)
    extra = (*GRAPHED, "fl.participation=1.0", "fl.local_epochs=1")
    eager_history, eager = run(method, "mlp", "vectorized", "float64", "off", extra)
    eager_calls.clear()
    captures.clear()
    history, graphed_run = run(method, "mlp", "vectorized", "float64", "on", extra)
    assert_same_run(eager_history, eager, history, graphed_run)
    assert cpu_graphs and not [g.failed for g in cpu_graphs if g.failed]
    # one per update, kept
    assert len(cpu_graphs) == sum(len(stage.updates) for stage in graphed_run.round_plan().stages)
    assert len(eager_calls) == len(captures) == 3 and eager_calls[0] > 0 and captures[0] > 0
    assert eager_calls[2] == 0, eager_calls
    if method not in LOSS_CHANGES_AFTER_ROUND_1:  # round 3 then only captures the patterns round 2 met
        assert captures[2] == 0, captures


# FedProto trains on CE alone until the server has prototypes (round 1), then on its prototype loss
LOSS_CHANGES_AFTER_ROUND_1 = {"fedproto"}


@pytest.mark.parametrize("method", ["fedavg", "fedsiam_da"])
@pytest.mark.parametrize("setting", ["runtime.client_chunk=2", "fl.lr_decay=0.9"])
def test_kept_graphs_with_chunks_of_clients_and_a_decaying_learning_rate(method, setting, cpu_graphs, monkeypatch):
    """Chunks of clients (5 a round, 2 + 2 + 1) share the kept tensors and graphs of their size, one arena
    each size, not one each chunk; a learning rate that decays every round keeps each update's optimizer
    (its new rate set, its momentum zeroed) and captures the steps anew at each rate, not the patterns of
    shorter batches, which it would replay once. Either way the run equals the eager one in float64."""
    from test_executor_equivalence import GRAPHED, assert_same_run, run

    from autofl.accel import vectorized

    patterns: list[object] = []
    graphed = vectorized._Step.graphed

    def recorded(self, rows, opt, runs=None):
        if runs is not None:
            patterns.append(runs)
        return graphed(self, rows, opt, runs)

    monkeypatch.setattr(vectorized._Step, "graphed", recorded)
    extra = (*GRAPHED, "fl.participation=1.0", "fl.local_epochs=1", setting)
    eager_history, eager = run(method, "mlp", "vectorized", "float64", "off", extra)
    history, graphed_run = run(method, "mlp", "vectorized", "float64", "on", extra)
    assert_same_run(eager_history, eager, history, graphed_run)
    arenas = graphed_run.executor.arenas
    updates = len(graphed_run.round_plan().stages[0].updates)
    if setting.startswith("runtime.client_chunk"):
        assert sorted(arenas) == [1, 2]
        assert len(cpu_graphs) == 2 * updates  # a StepGraphs per update and chunk size
    else:
        (arena,) = arenas.values()
        assert len(arena.optimizers) == updates and not patterns
        assert len({id(g) for g in cpu_graphs}) == updates

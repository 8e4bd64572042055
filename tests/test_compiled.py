"""runtime.compile: the config word, what `auto` chooses and says, and the per-process cache of compiled steps.

Exactness of compiled steps against eager is in test_executor_equivalence.py (test_compiled_steps_equal_eager).
"""

from __future__ import annotations

import pytest
import torch

from conftest import spy_whole_steps

from autofl.accel import compiled
from autofl.engine.executor import Workspace, batch_cuts
from autofl.accel.choice import make_executor
from autofl.errors import ConfigError
from autofl.experiment import load_experiment


@pytest.mark.parametrize("text,word", [("on", "on"), ("off", "off"), ("true", "on"), ("false", "off"),
                                       ("auto", "auto")])
def test_yaml_on_off_are_the_words_not_booleans(text, word):
    assert load_experiment(None, [f"runtime.compile={text}"]).runtime.compile == word


def test_unknown_compile_value_is_one_line_naming_the_field():
    with pytest.raises(ConfigError) as err:
        load_experiment(None, ["runtime.compile=always"])
    line = str(err.value)
    assert "\n" not in line and "runtime.compile" in line and "auto" in line and "off" in line


def test_auto_compiles_long_vectorized_cpu_trials_and_graphs_every_vectorized_cuda_trial():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    need = compiled.AUTO_MIN_STEPS_CPU
    assert compiled.choose_compile("auto", cpu, 10, "vectorized", need // 10)[0] is True
    short, why = compiled.choose_compile("auto", cpu, 10, "vectorized", need // 10 - 1)
    assert short is False and f"{need - 10} lockstep steps are too few" in why
    # per-client steps stay eager on CPU however long the trial; unknown steps (the search's banner) too
    seq, why = compiled.choose_compile("auto", cpu, 10_000, "sequential", 10_000)
    assert seq is False and "per-client steps" in why
    banner, why = compiled.choose_compile("auto", cpu, 10_000, "vectorized", None)
    assert banner is False and f"at least {need}" in why
    # on CUDA the vectorized executor's whole steps replay as CUDA graphs: nothing to compile, so even a
    # one-round trial takes them; the sequential executor's per-client steps stay eager under auto
    assert compiled.choose_compile("auto", cuda, 1, "vectorized") == (
        True, "runtime.compile=auto: whole steps replayed as CUDA graphs (nothing to compile: a round captures "
              "each stage's step once, at about the cost of one eager step)")
    seq, why = compiled.choose_compile("auto", cuda, 10_000, "sequential")
    assert seq is False and "per-client steps on CUDA" in why
    assert compiled.choose_compile("on", cpu, 1) == (True, "runtime.compile=on, default mode")
    assert compiled.choose_compile("on", cuda, 1) == (True, "runtime.compile=on, whole steps replayed as CUDA graphs")
    assert compiled.choose_compile("on", cuda, 1, "sequential")[1].endswith("reduce-overhead mode")
    assert compiled.choose_compile("off", cuda, 10_000)[0] is False


@pytest.mark.parametrize("rounds,compiles", [(3, False), (2000, True)])
def test_a_trials_lockstep_steps_decide_auto_on_cpu(rounds, compiles):
    """The simulation counts its lockstep steps from its data (the longest client's batches x epochs);
    only building it, nothing is compiled here."""
    from autofl.engine.simulation import Simulation
    from autofl.methods.registry import get_method_class

    exp = load_experiment(None, [f"fl.rounds={rounds}", "fl.batch_size=8", "runtime.executor=vectorized",
                                 "runtime.compile=auto"])
    sim = Simulation(exp, get_method_class(exp.method.name))
    per_round = sim.lockstep_steps_per_round()
    longest = max(len(c.train) for c in sim.data.clients)
    assert per_round == len(batch_cuts(longest, 8)) * exp.fl.local_epochs  # the executors' own batches
    assert sim.executor.compile_steps is compiles
    assert f"{rounds * per_round} lockstep steps" in sim.executor_line


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("choice", ["auto", "on", "off"])
def test_executor_line_says_what_compile_chose_and_why(executor, choice):
    ws = Workspace(torch.nn.Sequential(torch.nn.Linear(4, 2)), ())
    ex, line = make_executor(executor, ws, None, torch.device("cpu"), choice, rounds=20)
    assert ex.compile_steps is (choice == "on")
    assert f"steps: {'compiled' if choice == 'on' else 'eager'} (runtime.compile={choice}" in line


def test_a_step_is_compiled_once_per_key_and_reused_across_trials():
    def loss_a(ws, x, y, flags):
        return x.sum()

    def loss_b(ws, x, y, flags):
        return x.sum()

    cpu = torch.device("cpu")
    first = compiled.compiled(compiled.client_loss, compiled.step_key(loss_a, 0, 0), cpu)
    # a later trial's round makes a new closure of the same loss: the same compiled function serves it
    again = compiled.compiled(compiled.client_loss, compiled.step_key(loss_a, 0, 0), cpu)
    other_update = compiled.compiled(compiled.client_loss, compiled.step_key(loss_a, 0, 1), cpu)
    other_loss = compiled.compiled(compiled.client_loss, compiled.step_key(loss_b, 0, 0), cpu)
    assert first is again
    assert len({id(first), id(other_update), id(other_loss)}) == 3


def test_steps_per_call_is_a_power_of_two_within_the_calls_arithmetic_and_graph_size():
    """Steps too small to pay a compiled call's overhead run several to a call: as many as fit in
    CALL_FLOPS for all clients and in MAX_GRAPH_NODES, rounded down to a power of two (few variants to
    compile), at most MAX_STEPS_PER_CALL."""
    budget, cap, nodes = compiled.CALL_FLOPS, compiled.MAX_STEPS_PER_CALL, compiled.MAX_GRAPH_NODES
    size = compiled.StepSize
    assert compiled.steps_per_call(size(int(budget), 1), 1) == 1
    assert compiled.steps_per_call(size(int(budget / 10), 1), 10) == 1  # ten clients fill the budget
    assert compiled.steps_per_call(size(int(budget / 20), 1), 10) == 2
    assert compiled.steps_per_call(size(int(budget / 30), 1), 10) == 2
    assert compiled.steps_per_call(size(int(budget / 40), 1), 10) == 4
    assert compiled.steps_per_call(size(0, 1), 20) == cap
    assert compiled.steps_per_call(size(0, nodes // 4), 20) == 4  # a large graph: fewer steps to a call
    assert compiled.steps_per_call(size(0, nodes), 20) == 1


def test_a_clients_step_size_is_its_forward_and_backward_products_and_graph():
    """One client's step of a linear head on a batch of B: the forward product (2 B x 100 x 10 FLOPs)
    and the weight's gradient (the same again; the input needs no gradient), and its autograd graph
    (cross-entropy's nodes, the linear layer's, the weight's transpose and the two accumulators).
    Measured on copies of client 0's row of the stack: the stack is untouched."""
    import torch.nn.functional as F

    ws = Workspace(torch.nn.Linear(100, 10), ())
    k, b = 3, 8
    state = {n: torch.stack([p.detach()] * k) for n, p in ws.named_parameters()}
    before = {n: t.clone() for n, t in state.items()}
    dims = dict.fromkeys(state, 0)

    def head_loss(ws, x, y, flags):
        return F.cross_entropy(ws.model(x), y)

    x, y = torch.randn(b, 100), torch.randint(0, 10, (b,))
    step = compiled.client_step_size(ws, head_loss, ["model.weight", "model.bias"], state, dims, x, y,
                                     {"h": torch.zeros(k)})
    assert step.flops == 2 * (2 * b * 100 * 10)
    w = torch.randn(10, 100, requires_grad=True)
    assert step.nodes == compiled.autograd_nodes(F.cross_entropy(F.linear(x, w, torch.zeros(10, requires_grad=True)),
                                                                 y).grad_fn) >= 4
    for n, t in state.items():
        assert torch.equal(t, before[n]) and t.grad is None


def test_only_runs_of_whole_steps_of_the_same_clients_share_a_call():
    """`_ChunkRun._calls`: a call of several steps starts only where that many consecutive steps have
    the same active clients, each with a full batch (one run of the batch size), and none finishing
    its epoch (its rows are saved after that step); runs are cut into calls of exactly `per_call`
    steps, the rest run alone."""
    from types import SimpleNamespace

    from autofl.accel import vectorized

    b = 8
    full4, full3 = [(0, 4, b)], [(0, 3, b)]
    lock = [(4, full4, 4)] * 5 + [(4, full4, 3)]  # steps 0-4 whole; 5: a client finishes after it
    lock += [(3, full3, 3)] * 3 + [(3, [(0, 2, b), (2, 3, 5)], 2)]  # 6-8 whole; 9: a shorter last batch
    lock += [(2, [(0, 2, b)], 2)] * 2 + [(2, [(0, 2, 3)], 2)] + [(2, [(0, 2, b)], 2)] * 4  # 10-11, 13-16
    run = SimpleNamespace(plan=SimpleNamespace(batch_size=b))
    calls = vectorized._ChunkRun._calls(run, lock, 2)
    assert calls == {0: 2, 2: 2, 6: 2, 10: 2, 13: 2, 15: 2}
    assert vectorized._ChunkRun._calls(run, lock, 4) == {0: 4, 13: 4}
    assert vectorized._ChunkRun._calls(run, lock, 1) == {}


def exp_overrides(method: str) -> list[str]:
    return [f"method.name={method}", "fl.rounds=3", "data.num_clients=4", "runtime.executor=vectorized"]


@pytest.mark.parametrize("method,extra", [("fedeccr", ()), ("fedavg", ()), ("ditto", ("fl.momentum=0",)),
                                          ("fedsiam_da", ("fl.momentum=0", "runtime.dtype=float64"))])
def test_a_compiled_step_does_not_recompile_across_rounds(method, extra, monkeypatch):
    """What changes between rounds reaches the compiled step as tensor inputs (FedECCR's loss weight
    alpha = 1 - r/R is a 0-dim tensor), so rounds 2 and 3 replay what round 1 compiled: torch raises
    under the "fail_on_recompile" stance otherwise. The compiled run's metrics are the eager run's.
    Ditto and FedSiam-DA with plain SGD run their two updates a step as one compiled call (FedSiam-DA's
    second update with frozen BatchNorm statistics, its history flag a tensor; in float64, as in the
    executor-equivalence tests: its cosine losses through BatchNorm flip a validation sample in float32
    between any two summation orders, compiled per update or in one call alike). Their linear weights
    are updated by the probed in-place product (accel/linear_probes.py), whose plan is found once, and
    Ditto's v by its proximal term's in-place step too."""
    from autofl.accel import linear_probes, vectorized
    from autofl.engine.simulation import Simulation
    from autofl.methods.registry import get_method_class

    monkeypatch.setattr(linear_probes, "MIN_PROBED_WEIGHT", 0)  # the digits MLP's weights are small
    together = spy_whole_steps(monkeypatch, vectorized._StageStep)
    exp = load_experiment(None, [*exp_overrides(method), *extra, "runtime.compile=on"])
    sim = Simulation(exp, get_method_class(method))
    sim.run_round()
    with torch.compiler.set_stance("fail_on_recompile"):
        sim.run_round()
        sim.run_round()
    assert sim.round == 3
    assert bool(together) == (method in ("ditto", "fedsiam_da"))
    assert any(linear_probes.LinearProbes.of(sim.workspace).plans.values()) == bool(together)
    # and what it replays is the eager step: the same metrics every round (float32, the executors' tolerance)
    eager = Simulation(load_experiment(None, [*exp_overrides(method), *extra, "runtime.compile=off"]),
                       get_method_class(method))
    for _ in range(3):
        eager.run_round()
    assert len(eager.history) == len(sim.history) == 3
    for a, b in zip(eager.history, sim.history):
        assert set(a) == set(b)
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-4, (key, a[key], b[key])


def test_auto_stays_eager_on_cpu_without_a_cpp_compiler(monkeypatch, tmp_path):
    """Inductor builds CPU kernels with $CXX (default g++): where none is installed, `auto` says so and
    runs eager instead of failing at the first step; `on` is the user's explicit choice and stays on."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    cpu = torch.device("cpu")
    eager, why = compiled.choose_compile("auto", cpu, 10_000, "vectorized", 10_000)
    assert eager is False and "no C++ compiler" in why and "no-such-compiler" in why
    assert compiled.choose_compile("on", cpu, 10_000, "vectorized", 10_000)[0] is True
    monkeypatch.delenv("CXX")
    assert compiled.cpu_compiler() is not None  # this machine (and CI) has g++: the compiled tests run
    assert compiled.choose_compile("auto", cpu, 10_000, "vectorized", 10_000)[0] is True


def test_the_whole_cpu_step_replays_across_learning_rates_and_falls_back_with_momentum(monkeypatch):
    """On CPU the vectorized step of plain SGD compiles with its update (accel/compiled.batched_sgd_step):
    a decaying learning rate and another trial's rate replay the same graph; with momentum the update
    stays torch's SGD.step outside the compiled gradients, so a search's momenta compile nothing more.
    Every run's metrics and global model are eager's."""
    from autofl.accel import vectorized
    from autofl.engine.simulation import Simulation
    from autofl.methods.registry import get_method_class

    whole_steps = spy_whole_steps(monkeypatch, vectorized._Step)

    def sim(lr: float, momentum: float, compile_steps: str) -> Simulation:
        exp = load_experiment(None, [*exp_overrides("fedavg"), "fl.rounds=2", "fl.batch_size=16", f"fl.lr={lr}",
                                     f"fl.momentum={momentum}", "fl.lr_decay=0.5", f"runtime.compile={compile_steps}"])
        return Simulation(exp, get_method_class("fedavg"))

    def same_as_eager(run: Simulation, lr: float, momentum: float) -> None:
        eager = sim(lr, momentum, "off")
        list(eager.run())
        for a, b in zip(eager.history, run.history, strict=True):
            for key in a:
                assert abs(a[key] - b[key]) <= 1e-4, (lr, momentum, key, a[key], b[key])
        for key, value in eager.global_state.items():
            torch.testing.assert_close(value, run.global_state[key], rtol=1e-4, atol=1e-5)

    for momentum in (0.0, 0.5):  # compiles the whole step, then the gradients-only step
        first = sim(0.05, momentum, "on")
        list(first.run())
        same_as_eager(first, 0.05, momentum)
    assert whole_steps, "the whole step never ran"
    whole_steps.clear()
    with torch.compiler.set_stance("fail_on_recompile"):
        for lr, momentum in [(0.1, 0.0), (0.02, 0.3), (0.2, 0.9)]:
            run = sim(lr, momentum, "on")
            list(run.run())  # rounds 1 and 2 at lr and lr / 2: the graphs compiled above
            same_as_eager(run, lr, momentum)
            assert bool(whole_steps) == (momentum == 0), (momentum, len(whole_steps))
            whole_steps.clear()


def test_the_whole_steps_batch_rows_keep_one_layout_when_sampled_clients_differ(monkeypatch):
    """With partial participation each round's clients have another longest client, so another
    number of lockstep steps; the batch rows the whole step reads must still arrive contiguous with
    the same strides (the compiled graph guards on them: one stride per step count was one recompile
    per distinct count). Under the "fail_on_recompile" stance the later rounds replay round 1's graph."""
    from autofl.accel import vectorized
    from autofl.engine.simulation import Simulation
    from autofl.methods.registry import get_method_class

    calls = spy_whole_steps(monkeypatch, vectorized._Step)
    overrides = ["method.name=fedavg", "fl.rounds=4", "data.num_clients=8", "fl.participation=0.5",
                 "data.partition.alpha=0.1", "fl.momentum=0", "fl.batch_size=16", "runtime.executor=vectorized"]
    sim = Simulation(load_experiment(None, [*overrides, "runtime.compile=on"]), get_method_class("fedavg"))
    steps: set[int] = set()
    original_lockstep = vectorized._ChunkRun._lockstep

    def lockstep(self, max_steps):
        steps.add(max_steps)
        return original_lockstep(self, max_steps)

    monkeypatch.setattr(vectorized._ChunkRun, "_lockstep", lockstep)
    sim.run_round()
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(3):
            sim.run_round()
    assert len(steps) > 1, f"the sampled clients never changed the step count ({steps}): the test tests nothing"
    layouts = {(tuple(rows.shape), rows.stride(), rows.is_contiguous()) for _, _, rows in calls}
    assert len(layouts) == 1 and next(iter(layouts))[2], layouts


def test_calls_of_small_steps_use_256_bit_vectors_only_where_the_cpu_has_512_bit_ones(monkeypatch):
    cpu = torch.device("cpu")
    for capability, options in (("AVX512", {"cpp.simdlen": 8}), ("AVX512_BF16", {"cpp.simdlen": 8}),
                                ("AVX2", None), ("DEFAULT", None), ("SVE256", None)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        assert compiled.small_step_options(cpu) == options, capability
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert compiled.small_step_options(torch.device("cuda")) is None  # CUDA graphs' mode, no options


def test_a_function_compiled_with_options_is_its_own_entry(monkeypatch):
    made = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: made.append(kw) or fn)
    monkeypatch.setattr(compiled, "_COMPILED", {})
    cpu = torch.device("cpu")
    plain = compiled.compiled(compiled.client_loss, "key", cpu)
    narrow = compiled.compiled(compiled.client_loss, "key", cpu, {"cpp.simdlen": 8})
    assert plain is not narrow and compiled.compiled(compiled.client_loss, "key", cpu, {"cpp.simdlen": 8}) is narrow
    assert made == [{"mode": "default", "dynamic": False}, {"dynamic": False, "options": {"cpp.simdlen": 8}}]

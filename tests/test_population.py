"""Population trials (issue 37, items 1-2): C configs that differ only in fusible values trained as one
batched model give each member exactly the run it gives alone.

Each member of a population is compared with the same config trained alone by the vectorized executor
(eager, float64, on CPU): every evaluated round's metrics equal, and the final global state, every
client's kept state and the method's server state equal bit for bit. The members differ in every
fusible value at once (fl.lr, fl.momentum, fl.weight_decay, fl.lr_decay and the method's own), so a
value read from the wrong member would show. Clients are uneven (Dirichlet), participation < 1 and two
local epochs, as in tests/test_executor_equivalence.py.

Exact, that is, where the model has no BatchNorm layer: vmap's batching rule for BatchNorm lays its
gradient out over all the rows of the batched model, and the reduction that follows (the gradient of
the bias of the Linear before it) then sums in an order that depends on the number of rows (measured:
a Linear(64, 10) -> BatchNorm1d(10) bias gradient differs in the last bit between 4 and 8 rows). For
the methods whose model has one (DualFed's and FedSiam-DA's projectors) each member is compared with
its run alone within rounding instead (as the vectorized executor with the sequential one).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autofl.accel.population import RowSGD, SGDSettings
from autofl.config import FLConfig, fusible_fields
from autofl.data.datasets import RawDataset, load_raw_dataset
from autofl.engine.simulation import Simulation
from autofl.errors import ConfigError
from autofl.experiment import load_experiment
from autofl.methods.registry import all_methods, get_method_class
from autofl.population import Population, check_population, train_population

SCENARIO = ["fl.rounds=2", "data.num_clients=4", "data.partition.kind=dirichlet", "data.partition.alpha=0.3",
            "data.min_size=4", "fl.participation=0.75", "fl.batch_size=16", "fl.local_epochs=2",
            "runtime.dtype=float64", "runtime.device=cpu", "runtime.executor=vectorized", "runtime.compile=off"]
# the members' fl values: momentum on and off, weight decay on and off, a decaying rate
FL = [["fl.lr=0.05", "fl.momentum=0.9"], ["fl.lr=0.02", "fl.momentum=0.0", "fl.weight_decay=0.01"],
      ["fl.lr=0.08", "fl.momentum=0.5", "fl.lr_decay=0.9"]]
# DualFed: SupCon at its default tau = 0.05 is chaotic (see tests/test_executor_equivalence.py): 0.5
SMALL = {"dualfed": ["method.tau=0.5"]}
SCALES = [1.0, 0.5, 2.0]  # each member's fusible method parameters: the default times these
READY = sorted(n for n, c in all_methods().items() if c.population_ready)


@pytest.fixture(scope="module")
def raw() -> RawDataset:
    full = load_raw_dataset(load_experiment(None, []).data)
    return RawDataset("digits", full.train_x[:240], full.train_y[:240], full.test_x[:100], full.test_y[:100], 10)


def members(method: str, extra: tuple[str, ...] = ()) -> list[Any]:
    cls = get_method_class(method)
    out = []
    for fl, scale in zip(FL, SCALES):
        base = load_experiment(None, [*SCENARIO, f"method.name={method}", *SMALL.get(method, []), *extra])
        params = [f"method.{n}={base.method.params()[n] * scale}" for n in fusible_fields(cls.Params)]
        out.append(load_experiment(None, [*SCENARIO, f"method.name={method}", *SMALL.get(method, []), *fl, *params,
                                          *extra]))
    return out


def assert_equal_tree(a: Any, b: Any, where: str, exact: bool = True) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        if exact or not a.is_floating_point():
            assert torch.equal(a, b), where
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=where)
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_equal_tree(a[k], b[k], f"{where}.{k}", exact)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_tree(x, y, f"{where}[{i}]", exact)
    elif hasattr(a, "__dataclass_fields__"):
        assert_equal_tree(vars(a), vars(b), where, exact)
    elif exact or not isinstance(a, float):
        assert a == b, where
    else:
        assert abs(a - b) <= 1e-6, (where, a, b)


def has_batchnorm(sim: Simulation) -> bool:
    return any(isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)) for m in sim.model.modules())


def assert_members_run_alone(pop: Population, histories: list[list[dict[str, float]]], raw: RawDataset,
                             exact: bool = True) -> None:
    exact = exact and not has_batchnorm(pop.sims[0])
    for i, (member, history) in enumerate(zip(pop.sims, histories)):
        alone = Simulation(member.exp, get_method_class(member.exp.method.name), raw=raw)
        assert_equal_tree(history, list(alone.run()), f"member {i}: metrics", exact)
        assert_equal_tree(member.global_state, alone.global_state, f"member {i}: global_state", exact)
        assert_equal_tree(member.client_states, alone.client_states, f"member {i}: client_states", exact)
        assert_equal_tree(member.server_state, alone.server_state, f"member {i}: server_state", exact)
    assert len({repr(h) for h in histories}) == len(histories)  # the members really differ


@pytest.mark.parametrize("method", READY)
def test_each_member_equals_its_run_alone(method: str, raw: RawDataset) -> None:
    pop = Population(members(method), raw)
    assert pop.executor is not None  # trained as one population, not one config after another
    histories = pop.run()
    assert [len(h) for h in histories] == [2, 2, 2]
    assert_members_run_alone(pop, histories, raw)


def test_members_equal_their_runs_alone_with_a_stage_of_its_own_epochs(raw: RawDataset) -> None:
    """Ditto with personal epochs: a stage with epochs of its own before the FedAvg stage."""
    pop = Population(members("ditto", ("method.personal_epochs=2",)), raw)
    assert_members_run_alone(pop, pop.run(), raw)


def test_a_method_not_population_ready_runs_each_config_alone(raw: RawDataset, monkeypatch) -> None:
    method = "fedproto"  # as a method (a plugin's, say) that does not declare it
    monkeypatch.setattr(get_method_class(method), "population_ready", False)
    exps = [load_experiment(None, [*SCENARIO, f"method.name={method}", *fl]) for fl in FL]
    pop = Population(exps, raw)
    assert pop.executor is None
    assert_members_run_alone(pop, pop.run(), raw)


def test_a_population_of_one_is_the_run_alone(raw: RawDataset) -> None:
    exp = members("fedprox")[1]
    [history] = train_population([exp], raw)
    assert history == list(Simulation(exp, get_method_class("fedprox"), raw=raw).run())


def test_members_of_different_methods_are_refused_in_one_line() -> None:
    exps = [load_experiment(None, [*SCENARIO, "method.name=fedavg"]),
            load_experiment(None, [*SCENARIO, "method.name=fedprox"])]
    with pytest.raises(ConfigError) as err:
        check_population(exps)
    assert "method.name" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("key", "other"), [("fl.batch_size", "8"), ("seed", "3"), ("model.head_layers", "2"),
                                             ("method.personal_epochs", "2")])
def test_a_difference_in_a_non_fusible_key_is_refused_naming_it(key: str, other: str) -> None:
    base = [*SCENARIO, "method.name=ditto", "method.lam=0.3"]
    exps = [load_experiment(None, [*base, "fl.lr=0.01"]), load_experiment(None, [*base, "fl.lr=0.02", f"{key}={other}"])]
    with pytest.raises(ConfigError) as err:
        check_population(exps)
    message = str(err.value)
    assert f"member 1 has {key}=" in message and "\n" not in message
    assert "fl.lr" in message and "method.lam" in message  # what may differ


def test_fusible_fields_are_the_declared_ones() -> None:
    assert fusible_fields(FLConfig) == ("lr", "momentum", "weight_decay", "lr_decay")
    assert fusible_fields(get_method_class("fedprox").Params) == ("mu",)
    assert fusible_fields(get_method_class("ditto").Params) == ("lam",)  # not personal_epochs: a step count


def test_row_sgd_steps_each_configs_rows_as_sgd_steps_them_alone() -> None:
    """Rows r, r + C, ... are config r's: three steps of RowSGD equal torch.optim.SGD per config."""
    torch.manual_seed(0)
    settings = [SGDSettings(0.1, 0.9, 0.0), SGDSettings(0.05, 0.0, 0.01), SGDSettings(0.2, 0.5, 0.1)]
    c, k = len(settings), 2
    start = torch.randn(k * c, 3, 4, dtype=torch.float64)
    grads = [torch.randn_like(start) for _ in range(3)]
    stacked = start.clone()
    opt = RowSGD([stacked], settings)
    for g in grads:
        stacked.grad = g
        opt.step()
    for m, s in enumerate(settings):
        alone = start[m::c].clone()
        sgd = torch.optim.SGD([alone], lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
        for g in grads:
            alone.grad = g[m::c].clone()
            sgd.step()
        assert torch.equal(stacked[m::c], alone), m


# compiled population steps (CPU): members with plain SGD at different rates (a decaying one among them), so
# the whole step runs with its update and each row's rate is a tensor; with momentum, the gradients compiled
COMPILED_FL = {"plain": [["fl.lr=0.05", "fl.momentum=0"], ["fl.lr=0.02", "fl.momentum=0", "fl.lr_decay=0.9"]],
               "momentum": [["fl.lr=0.05", "fl.momentum=0.9"], ["fl.lr=0.02", "fl.momentum=0.5"]]}


@pytest.mark.parametrize(("method", "sgd"), [("fedfcd", "plain"), ("fedprox", "plain"), ("fedavg", "momentum")])
def test_compiled_members_equal_their_compiled_runs_alone(method: str, sgd: str, raw: RawDataset,
                                                          monkeypatch) -> None:
    """runtime.compile=on: a population's steps compile (the vectorized executor's whole steps, with linear
    probes; FedFCD's two updates in one call), and each member's run equals its run alone compiled within
    rounding (float64: inductor's kernels for the stack of both members' rows are not those for one
    member's, measured 3e-17 apart after two rounds; the members' runs differ by far more)."""
    from conftest import spy_whole_steps

    from autofl.accel import linear_probes, vectorized

    monkeypatch.setattr(linear_probes, "MIN_PROBED_WEIGHT", 0)  # the digits MLP's 64 x 100 weights are probed too
    spies = [spy_whole_steps(monkeypatch, vectorized._Step), spy_whole_steps(monkeypatch, vectorized._StageStep)]
    cls = get_method_class(method)
    exps = []
    for fl, scale in zip(COMPILED_FL[sgd], SCALES):
        base = load_experiment(None, [*SCENARIO, f"method.name={method}", "runtime.compile=on"])
        params = [f"method.{n}={base.method.params()[n] * scale}" for n in fusible_fields(cls.Params)]
        exps.append(load_experiment(None, [*SCENARIO, f"method.name={method}", "runtime.compile=on", *fl, *params]))
    pop = Population(exps, raw)
    assert pop.compile_steps and pop.compile_line.startswith("population steps: compiled (runtime.compile=on")
    histories = pop.run()
    assert [len(h) for h in histories] == [2, 2]
    # plain SGD: the whole steps ran, on the stack of both members' rows; with momentum none did
    whole = [call for spy in spies for call in spy]
    assert bool(whole) == (sgd == "plain")
    assert all(k == 2 * 3 for _, k, _ in whole)  # 3 sampled clients x 2 members
    for spy in spies:
        spy.clear()
    assert_members_run_alone(pop, histories, raw, exact=False)
    assert any(spies) == (sgd == "plain")  # and the runs alone compiled their whole steps too


def test_a_compiled_population_that_loses_members_trains_its_last_one_compiled(raw: RawDataset) -> None:
    """A cohort whose steps compile keeps compiling as ASHA prunes its members: its last member trains on
    through the population's compiled steps (alone, its run might be eager: `auto` counts one member's
    steps), and its rounds are still its run alone compiled."""
    exps = [load_experiment(None, [*SCENARIO, "method.name=fedavg", "runtime.compile=on", *fl])
            for fl in COMPILED_FL["momentum"]]
    assert Population(exps[1:], raw).executor is None  # one config from the start: its run alone, exactly
    pop = Population(exps, raw)
    first = pop.run_round()
    pop.keep([1])
    assert pop.executor is not None and pop.executor.compile_steps
    second = pop.run_round()
    alone = Simulation(exps[1], get_method_class("fedavg"), raw=raw)
    assert_equal_tree([first[1], second[0]], list(alone.run()), "metrics", exact=False)
    assert_equal_tree(pop.sims[0].global_state, alone.global_state, "global_state", exact=False)


# every population-ready method with every client each round; two (one of each kind) with participation < 1
JOINING = [(m, "1.0") for m in READY] + [("fedprox", "0.75"), ("fedproto", "0.75")]


@pytest.mark.parametrize(("method", "participation"), JOINING)
def test_members_that_join_later_equal_their_runs_alone(method: str, participation: str, raw: RawDataset,
                                                         monkeypatch) -> None:
    """A cohort refilled as members leave (autofl/tuning/strategy/cohorts.py): members that join at later
    rounds train beside those further on, each its own rounds. With every client sampled every round and a
    method whose step is the same at every round (`same_steps_every_round`), members at different rounds
    share one batched run; otherwise those of one round train together (participation < 1 samples other
    clients at another round). Either way each member's run is its run alone."""
    import autofl.accel.population as accel_population

    exps = members(method, (f"fl.participation={participation}",))
    groups: list[int] = []
    original = accel_population.fused_groups

    def counted(batch: list[Any]) -> list[list[int]]:
        out = original(batch)
        groups.append(len(out))
        return out

    monkeypatch.setattr(accel_population, "fused_groups", counted)
    pop = Population(exps[:2], raw)
    histories: list[list[dict[str, float]]] = [[], []]

    def record(results: list[dict[str, float] | None]) -> None:
        for history, metrics in zip(histories, results):
            if metrics is not None:
                history.append(metrics)

    record(pop.run_round())  # members 0 and 1 at round 1
    pop.add(exps[2:])
    histories.append([])
    record(pop.run_round())  # members 0 and 1 at their round 2, member 2 at its round 1
    assert pop.sims[0].done() and not pop.done()
    record(pop.run_round())  # member 2's round 2, alone
    assert pop.done() and [len(h) for h in histories] == [2, 2, 2]
    assert_members_run_alone(pop, histories, raw)
    same_steps = get_method_class(method).same_steps_every_round
    if not same_steps:  # grouped by round: members 0 and 1 apart from member 2
        assert groups == [1, 2, 1]
    elif participation == "1.0":  # the same clients every round: one batched run
        assert groups == [1, 1, 1]


def test_a_member_added_with_a_non_fusible_difference_is_refused(raw: RawDataset) -> None:
    pop = Population(members("fedavg")[:2], raw)
    other = load_experiment(None, [*SCENARIO, "method.name=fedavg", "fl.batch_size=8"])
    with pytest.raises(ConfigError, match="fl.batch_size"):
        pop.add([other])
    assert len(pop.sims) == 2

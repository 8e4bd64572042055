"""The server side of the method interface: hooks read a ServerContext and return a ServerUpdate,
the engine applies it, and a checkpoint restores the method's server state whole."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from autofl.engine.server import ServerContext, ServerState, ServerUpdate
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.base import Method, Upload
from autofl.methods.registry import get_method_class


@dataclasses.dataclass(frozen=True)
class TallyState(ServerState):
    contexts: tuple[tuple[int, int, bool], ...] = ()  # (round, completed, evaluated) of each hook call
    clients: tuple[int, ...] = ()  # every client whose upload the server saw, in order
    bias_sum: torch.Tensor | None = None


class Tally(Method):
    """FedAvg whose server records what it was shown and writes one global entry per round."""

    name = "tally"
    State = TallyState

    def init_server(self, ctx: ServerContext) -> ServerUpdate:
        assert ctx.state == TallyState()
        return ServerUpdate(state=TallyState(contexts=((ctx.round, ctx.completed, ctx.evaluated),)))

    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate:
        with pytest.raises(TypeError):
            ctx.global_state["head.0.bias"] = torch.zeros(1)  # type: ignore[index]  # read-only: return changes
        bias = ctx.global_state["head.0.bias"]
        state = dataclasses.replace(ctx.state, contexts=ctx.state.contexts + ((ctx.round, ctx.completed, ctx.evaluated),),
                                    clients=ctx.state.clients + tuple(u.cid for u in uploads),
                                    bias_sum=bias.sum().reshape(1))
        return ServerUpdate(global_state={"head.0.bias": bias + 1.0}, state=state)


def tally_sim() -> Simulation:
    exp = load_experiment(None, ["data.num_clients=4", "fl.participation=0.5", "fl.rounds=3", "fl.eval_every=2",
                                 "model.arch=mlp", "runtime.executor=sequential", "runtime.dtype=float64"])
    return Simulation(exp, Tally)


def test_server_hooks_see_values_and_their_update_is_applied():
    sim = tally_sim()
    assert isinstance(sim.server_state, TallyState) and sim.server_state.contexts == ((0, 0, False),)
    sampled = sim.sample_clients(0)
    aggregate_bias = None

    def spy(uploads: list[Upload]) -> dict[str, torch.Tensor]:
        nonlocal aggregate_bias
        out = Method.aggregate(sim.method, uploads)
        aggregate_bias = out["head.0.bias"].clone()
        return out

    sim.method.aggregate = spy  # type: ignore[method-assign]
    sim.run_round()
    assert sim.server_state.contexts == ((0, 0, False), (0, 1, False))  # round 0 trained; evaluated after 2
    assert sim.server_state.clients == tuple(sampled)
    torch.testing.assert_close(sim.global_state["head.0.bias"], aggregate_bias + 1.0)  # the update was applied
    torch.testing.assert_close(sim.server_state.bias_sum, aggregate_bias.sum().reshape(1))
    list(sim.run())
    assert [c[1:] for c in sim.server_state.contexts[1:]] == [(1, False), (2, True), (3, True)]  # every 2nd and the last


def test_a_checkpoint_restores_the_server_state_whole():
    sim = tally_sim()
    sim.run_round()
    state = sim.state_dict()
    fresh = tally_sim()
    fresh.load_state_dict(state)
    assert type(fresh.server_state) is TallyState and fresh.server_state.contexts == sim.server_state.contexts
    assert fresh.server_state.clients == sim.server_state.clients
    assert [sim.run_round() for _ in range(2)] == [fresh.run_round() for _ in range(2)]
    assert fresh.server_state.contexts == sim.server_state.contexts


def test_every_builtin_state_is_a_frozen_dataclass_whose_fields_have_defaults():
    for name in ("fedavg", "fedeccr", "fedfcd"):
        state = get_method_class(name).State()  # the state before init_server
        with pytest.raises(dataclasses.FrozenInstanceError):
            state.x = 1  # type: ignore[attr-defined]


def test_the_engine_imports_no_method():
    code = ("import sys, autofl.engine.simulation, autofl.engine.executor, autofl.engine.metrics, autofl.engine.server; "
            "print(sorted(m for m in sys.modules if m.startswith('autofl.methods')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

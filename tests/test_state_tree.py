"""map_tree: the one walker behind moving a restored checkpoint to the device and saving plain files."""

from __future__ import annotations

import pytest
import torch

from autofl.engine.simulation import Simulation
from autofl.engine.state import map_tree, plain_tree
from autofl.experiment import load_experiment
from autofl.features import ClassStats
from autofl.methods.registry import get_method_class


def test_map_tree_rebuilds_dataclasses_and_containers_or_flattens_dataclasses():
    stats = ClassStats(torch.tensor([1.0, 2.0]), torch.ones(2, 3))
    tree = {"a": [stats, (torch.zeros(1), 3)], "b": "text"}
    doubled = map_tree(tree, lambda x: x * 2 if isinstance(x, torch.Tensor) else x)
    assert isinstance(doubled["a"][0], ClassStats) and isinstance(doubled["a"], list) and isinstance(doubled["a"][1], tuple)
    assert torch.equal(doubled["a"][0].counts, torch.tensor([2.0, 4.0])) and doubled["a"][0].covs is None
    assert doubled["b"] == "text" and doubled["a"][1][1] == 3
    plain = plain_tree(tree)
    assert plain["a"][0] == {"counts": stats.counts, "means": stats.means, "covs": None}
    assert plain["a"][1][0] is tree["a"][1][0]  # leaves are kept, not copied


def test_a_fedfcd_state_with_class_stats_restores_into_a_fresh_simulation():
    exp = load_experiment(None, ["method.name=fedfcd", "fl.rounds=3"])
    sim = Simulation(exp, get_method_class(exp.method.name))
    sim.run_round()
    state = sim.state_dict()
    assert state["method_state"]["lfrs"] and all(isinstance(v, ClassStats) for v in state["method_state"]["lfrs"].values())
    fresh = Simulation(exp, get_method_class(exp.method.name))
    fresh.load_state_dict(state)
    assert fresh.round == 1
    assert [sim.run_round() for _ in range(2)] == [fresh.run_round() for _ in range(2)]


@pytest.mark.parametrize("method", ["fedproto", "fedgh", "ditto", "fedrep"])
def test_a_baselines_checkpoint_loads_weights_only_and_continues_exactly(method, tmp_path):
    """FedProto's prototypes (its server state), FedGH's server-trained head (global state), Ditto's
    personal models and FedRep's heads (client states) survive a weights-only checkpoint."""
    exp = load_experiment(None, [f"method.name={method}", "fl.rounds=3", "data.num_clients=4", "fl.participation=0.5"])
    sim = Simulation(exp, get_method_class(method))
    sim.run_round()
    torch.save(plain_tree(sim.state_dict()), tmp_path / "sim.pt")
    fresh = Simulation(exp, get_method_class(method))
    fresh.load_state_dict(torch.load(tmp_path / "sim.pt", weights_only=True))
    assert [sim.run_round() for _ in range(2)] == [fresh.run_round() for _ in range(2)]

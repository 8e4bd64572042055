"""Harmed clients (issue 40 item 2): with `eval.harmed_clients`, every evaluated round reports
`harmed_frac` (the share of clients whose personal test accuracy is below their own training alone,
the built-in `local` method) and `harmed_vs_global` (below the FedAvg global model on their data).
The references are computed once per partition and seed, with the study's base training settings,
and cached in the study folder; they cost no trial's rounds."""

from __future__ import annotations

import json

import pytest

import autofl.harm_references as refs
from autofl.engine.harm import HarmReference, harmed_metrics
from autofl.engine.metrics import client_test_accuracies
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class
from autofl.tuning.strategy.objectives import REPORTED_KEYS, TEST_METRICS
from autofl.tuning.tune.trainable import FLTrainable

TINY = ["data.num_clients=5", "fl.rounds=2", "runtime.compile=off", "runtime.dtype=float64"]


def test_harmed_fractions_on_fixed_accuracies():
    ref = HarmReference(local=[0.5, 0.6, None, 0.9], global_model=[0.4, 0.7, 0.8, 0.95])
    # client 2 has no local reference (no test samples there) and client 3 none of its own
    out = harmed_metrics([0.55, 0.6, 0.7, None], ref)
    assert out == {"harmed_frac": 0.0, "harmed_vs_global": pytest.approx(2 / 3)}  # 0.6 < 0.7, 0.7 < 0.8
    assert harmed_metrics([0.4, 0.5, 0.7, 0.8], ref) == {"harmed_frac": 1.0, "harmed_vs_global": 0.75}
    assert harmed_metrics([0.5, 0.5], ref) == {}  # another number of clients: the reference does not apply
    assert {"harmed_frac", "harmed_vs_global"} <= set(TEST_METRICS) & set(REPORTED_KEYS)


def test_local_trains_every_client_alone_and_ships_nothing():
    exp = load_experiment(None, [*TINY, "method.name=local"])
    sim = Simulation(exp, get_method_class("local"))
    start = {k: v.clone() for k, v in sim.global_state.items()}
    rounds = list(sim.run())
    assert all(m["upload_bytes"] == m["download_bytes"] == 0 for m in rounds)
    assert not any(k.startswith("global_") for m in rounds for k in m)
    # nothing is averaged: the global state is the initial model still, so each client trains on from its
    # own model (the initial one in its first round), which only its own data changed
    assert sim.shared == [] and all(sim.global_state[k].equal(v) for k, v in start.items())
    states = [sim.client_states[c]["private"] for c in range(5)]
    assert all(set(s) == set(start) for s in states)


def test_a_run_compares_each_client_with_its_references(tmp_path):
    exp = load_experiment(None, [*TINY, "method.name=fedrep", "eval.harmed_clients=true"])
    reference = refs.harm_reference(exp, folder=tmp_path)
    # the references are the local run's personal and the FedAvg run's global accuracy per client
    local = Simulation(refs.reference_experiment(exp, "local"), get_method_class("local"))
    list(local.run())
    assert reference.local == client_test_accuracies(local, global_model=False)
    fedavg = Simulation(refs.reference_experiment(exp, "fedavg"), get_method_class("fedavg"))
    list(fedavg.run())
    assert reference.global_model == client_test_accuracies(fedavg, global_model=True)

    sim = Simulation(exp, get_method_class("fedrep"))
    sim.harm_reference = reference
    last = list(sim.run())[-1]
    mine = client_test_accuracies(sim, global_model=False)
    assert last["harmed_frac"] == sum(a < r for a, r in zip(mine, reference.local)) / 5
    assert last["harmed_vs_global"] == sum(a < r for a, r in zip(mine, reference.global_model)) / 5


def test_references_are_computed_once_and_read_from_the_folder_after(tmp_path, monkeypatch):
    exp = load_experiment(None, [*TINY, "eval.harmed_clients=true"])
    first = refs.harm_reference(exp, folder=tmp_path)
    (cached,) = tmp_path.glob("*.json")
    assert json.loads(cached.read_text())["reference"] == first.to_json()

    def never(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr(refs, "compute_reference", never)
    assert refs.harm_reference(exp, folder=tmp_path) == first
    # a searched parameter of the trial (lr, a method's) does not change the reference: the base's training does
    other = load_experiment(None, [*TINY, "eval.harmed_clients=true", "fl.lr=0.3", "method.name=fedprox"])
    assert refs.harm_reference(other, exp.fl, folder=tmp_path) == first
    with pytest.raises(AssertionError, match="computed again"):  # another seed is another partition
        refs.harm_reference(load_experiment(None, [*TINY, "seed=1"]), folder=tmp_path)


def test_a_study_trial_reports_them_with_the_references_cached_in_the_study(tmp_path):
    base = {"data": {"num_clients": 5}, "fl": {"rounds": 2}, "method": {"name": "ditto"},
            "eval": {"harmed_clients": True}, "runtime": {"compile": "off"}}
    t = FLTrainable.__new__(FLTrainable)  # what tune.with_parameters hands to setup, minus the cluster
    t.setup({"fl.lr": 0.1}, base=base, threads=1, reference_dir=str(tmp_path / "references"))
    results = [t.step(), t.step()]
    assert all(0 <= r["harmed_frac"] <= 1 and 0 <= r["harmed_vs_global"] <= 1 for r in results)
    assert [r["round"] for r in results] == [1, 2]  # the references took no round of the trial
    assert len(list((tmp_path / "references").glob("*.json"))) == 1

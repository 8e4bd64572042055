"""scripts/bench_round.py: the round benchmark runs end to end and its synthetic data has the real shapes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_round.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_round", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthetic_dataset_has_the_official_shape_sizes_and_classes():
    bench = load_script()
    raw = bench.synthetic_dataset("cifar10")
    assert raw.train_x.shape == (50000, 3, 32, 32) and raw.test_x.shape == (10000, 3, 32, 32)
    assert raw.num_classes == 10 and set(raw.train_y.unique().tolist()) == set(range(10))
    again = bench.synthetic_dataset("cifar10")
    assert torch.equal(raw.train_x[:100], again.train_x[:100])  # fixed seed: every run times the same data


def test_bench_round_times_both_executors_on_digits():
    out = subprocess.run([sys.executable, str(SCRIPT), "--scenario", "digits", "--method", "fedavg",
                          "--executor", "both", "--repeats", "1", "--synthetic"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert any(line.startswith("digits fedavg") and "sequential" in line for line in lines)
    assert any(line.startswith("digits fedavg") and "vectorized" in line for line in lines)
    speedup = float(next(line for line in lines if line.startswith("min_speedup")).split()[-1])
    assert speedup > 0
    table = [line for line in lines if line.startswith("| fedavg |")]
    assert len(table) == 1 and float(table[0].split("|")[4]) > 0  # the floor is a positive time


def _digits_round_flops(bench, method: str, *sets: str) -> float:
    return bench.round_flops(method, [*bench.SCENARIOS["digits"], f"method.name={method}", "fl.rounds=3",
                                      "fl.eval_every=1000", "data.num_clients=4", *sets], None)


def test_the_floor_counts_every_sample_once_for_fedavg_and_every_head_epoch_of_fedrep():
    """FedAvg's round is each sampled training row through one forward+backward of the MLP, and the
    server's weighted average of the clients' models; FedRep's head stage (encoder frozen) adds the
    same FLOPs for each further head epoch."""
    from torch.utils.flop_counter import FlopCounterMode

    from autofl.engine.executor import batch_cuts
    from autofl.engine.simulation import Simulation
    from autofl.experiment import load_experiment
    from autofl.methods.registry import get_method_class

    bench = load_script()
    exp = load_experiment(None, [*bench.SCENARIOS["digits"], "method.name=fedavg", "data.num_clients=4"])
    sim = Simulation(exp, get_method_class("fedavg"), None)
    clients = sim.sample_clients(2)
    rows = sum(b - a for cid in clients for a, b in batch_cuts(len(sim.data.clients[cid].train), exp.fl.batch_size))
    model = sim.method.build_model()
    with FlopCounterMode(display=False) as one:
        torch.nn.functional.cross_entropy(model(sim.data.x[:1]), sim.data.y[:1]).backward()
    average = 2 * len(clients) * sum(p.numel() for p in model.parameters())  # weights (1, K) @ models (K, n)
    assert _digits_round_flops(bench, "fedavg") == rows * one.get_total_flops() + average
    by_epochs = [_digits_round_flops(bench, "fedrep", f"method.head_epochs={h}") for h in (1, 2, 3)]
    assert by_epochs[2] - by_epochs[1] == by_epochs[1] - by_epochs[0] > 0


def test_compiling_pays_at_the_round_its_saving_covers_the_compile_time():
    bench = load_script()
    assert bench.pays_at_round(10.0, eager_s=1.0, compiled_s=0.5) == 20
    assert bench.pays_at_round(10.5, eager_s=1.0, compiled_s=0.5) == 21
    assert bench.pays_at_round(-1.0, eager_s=1.0, compiled_s=0.5) == 0  # first round no slower: pays at once
    assert bench.pays_at_round(10.0, eager_s=1.0, compiled_s=1.0) == float("inf")  # never
    assert bench.pays_at_round(10.0, eager_s=1.0, compiled_s=1.2) == float("inf")


PEER = SCRIPT.parent / "peer_pfllib.py"


def test_peer_reads_pfllibs_round_times_in_both_of_its_formats():
    spec = importlib.util.spec_from_file_location("peer_pfllib", PEER)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    lines = ["------------------------- time cost ------------------------- 3.4877495765686035",  # serveravg
             "-" * 50 + " 5.846229791641235",  # serverproto
             "-------------Round number: 0-------------", "Average time cost: 22.17s.", "-" * 50]
    assert [float(m.group(1)) for line in lines if (m := peer.ROUND_LINE.match(line))] == [3.4877495765686035,
                                                                                          5.846229791641235]


def test_peer_runs_pfllib_scripts_with_stand_ins_for_what_they_import_but_never_call(tmp_path):
    script = tmp_path / "main.py"
    script.write_text("import sys, ujson, cvxpy as cp, h5py\nfrom calmsize import size\n"
                      "ujson.dump({'argv': sys.argv[1:], 'cp': cp.__name__}, open('out.json', 'w'))\n")
    subprocess.run([sys.executable, str(PEER), "--inside", str(script), "-gr", "2"], cwd=tmp_path, check=True,
                   timeout=60)
    assert (tmp_path / "out.json").read_text() == '{"argv": ["-gr", "2"], "cp": "cvxpy"}'


def test_graph_host_cost_runs_the_graph_branches_on_cpu():
    """scripts/graph_host_cost.py: the executor's CUDA-graph branches on CPU with graphs that cost nothing;
    most steps replay, few run eagerly."""
    script = SCRIPT.parent / "graph_host_cost.py"
    out = subprocess.run([sys.executable, str(script), "--scenario", "fedfcd-t1", "--method", "fedavg,fedrep",
                          "--rounds", "2"], capture_output=True, text=True, timeout=300, check=True).stdout
    for method in ("fedavg", "fedrep"):
        fields = next(line for line in out.splitlines() if line.startswith(f"graph_host[{method}]")).split()
        values = dict(zip(fields[1::2], map(float, fields[2::2])))
        assert values["round_s"] > 0
        assert values["replays_per_round"] > 2 * values["eager_vmap_calls_per_round"] > 0

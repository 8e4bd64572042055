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

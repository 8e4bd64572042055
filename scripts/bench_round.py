"""Time one FL round under each executor against the round's FLOP floor.

    python scripts/bench_round.py [--scenario fedfcd-t1|fmnist-cnn|cifar10-cnn|digits]
                                  [--method fedavg|fedavg,moon|all] [--executor sequential|vectorized|both] [--repeats 3]
                                  [--device cpu|cuda] [--synthetic] [--compile off|on|auto|both]
                                  [--peer /path/to/PFLlib]

`--compile both` times each executor eager and compiled (runtime.compile off, then on) and prints
`compile[METHOD EXECUTOR] compile_s .. eager_round_s .. compiled_round_s .. pays_at_round N`:
compile_s is how much longer the compiled run's first round took than the eager run's, and N the
round from which the compiled run is ahead (inf: never, the compiled round is not faster).

The floor is the round's arithmetic divided by this machine's dense matmul rate: the FLOPs of the
method's second round (every stage, epoch, update, no-grad forward and post-training pass it
runs), counted by torch's FlopCounterMode around an eager vectorized run of that round, over the
FLOP/s of a large `torch.mm` measured here. Evaluation is not part of a round's time
(`fl.eval_every` is set past the timed rounds).

Scenarios (real data from $AUTOFL_DATA_ROOT, except digits):
  fedfcd-t1    FedFCD Table 1: Fashion-MNIST, mlp, pathological(2), 20 clients all sampled, batch 10,
               lr 0.01, momentum 0, E=1, pool train+test, split 0.75/0/0.25
  fmnist-cnn   Fashion-MNIST, cnn, dirichlet(0.5), 10 clients, batch 32, E=1
  cifar10-cnn  CIFAR-10, cnn, dirichlet(0.5), 20 clients, batch 32, E=1
  digits       scikit-learn digits, mlp, dirichlet(0.5), 10 clients, batch 32 (no download)

`--synthetic` times the scenario on random tensors of its dataset's shape and official sizes
(labels uniform, fixed seed) where the files are missing, e.g. CIFAR-10 on a machine with no network:
the arithmetic and the steps are the same, the accuracy is meaningless.

`--peer PFLLIB` (fedfcd-t1 only) then times PFLlib's own rounds of the same methods in the same run
(`scripts/peer_pfllib.py`: PFLlib's generator and DNN on the same workload) and prints
`peer[METHOD] pfllib ALGO round_s .. speedup_EXECUTOR ..` (autofl's fastest mode per executor).

Prints one line per method and executor, then `speedup[METHOD]` (sequential / vectorized) when
both run; then the smallest speedup (or the worst floor ratio with one executor).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from autofl.registry import DATASETS
from autofl.data.datasets import RawDataset
from autofl.device import resolve_device
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class, method_names

# PFLlib's algorithm for each method (--peer); FedFCD is not in PFLlib: the issue compared it with
# FedProto, the prototype method FedFCD builds on
PFLLIB_PEERS = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedper": "FedPer", "moon": "MOON", "ditto": "Ditto",
                "fedrep": "FedRep", "fedproto": "FedProto", "fedgh": "FedGH", "fedfcd": "FedProto"}

SCENARIOS: dict[str, list[str]] = {
    "fedfcd-t1": ["data.dataset=fmnist", "model.arch=mlp", "data.partition.kind=pathological",
                  "data.partition.classes_per_client=2", "data.num_clients=20", "fl.participation=1",
                  "fl.batch_size=10", "fl.lr=0.01", "fl.momentum=0", "fl.local_epochs=1", "data.pool=train+test",
                  "data.split.train=0.75", "data.split.val=0", "data.split.test=0.25"],
    "fmnist-cnn": ["data.dataset=fmnist", "model.arch=cnn", "data.partition.kind=dirichlet", "data.num_clients=10",
                   "fl.batch_size=32", "fl.local_epochs=1"],
    "cifar10-cnn": ["data.dataset=cifar10", "model.arch=cnn", "data.partition.kind=dirichlet", "data.num_clients=20",
                    "fl.batch_size=32", "fl.local_epochs=1"],
    "digits": ["data.dataset=digits", "model.arch=mlp", "data.partition.kind=dirichlet", "data.num_clients=10",
               "fl.batch_size=32", "fl.local_epochs=1"],
}


def synthetic_dataset(name: str, seed: int = 0) -> RawDataset:
    """Random normal images and uniform labels with `name`'s shape, class count and official sizes
    (as its `DatasetSpec` declares them)."""
    spec = DATASETS.get(name)
    num_classes, n_train, n_test = spec.num_classes, spec.train_size, spec.test_size
    if num_classes is None or spec.input_shape is None or n_train is None or n_test is None:
        raise SystemExit(f"--synthetic: dataset {name} declares no fixed shape and sizes")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_test, *spec.input_shape, generator=g)
    y = torch.randint(0, num_classes, (n_train + n_test,), generator=g)
    return RawDataset(name, x[:n_train], y[:n_train], x[n_train:], y[n_train:], num_classes)


def matmul_flops_per_second(device: torch.device, n: int = 2048, repeats: int = 15) -> float:
    """Dense float32 matmul rate of this machine: median over `repeats` of an n x n x n product (15: on a
    shared 2-core VM the median of 5 varied up to 1.5x between processes, and with it every floor)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_args(scenario: str, method: str, *extra: str) -> list[str]:
    """The experiment of a timed round: the scenario and method, with enough rounds and no evaluation in
    the rounds timed, then `extra` (KEY=VALUE settings)."""
    return [*SCENARIOS[scenario], f"method.name={method}", "fl.rounds=1000", "fl.eval_every=1000", *extra]


def round_flops(method: str, args: list[str], raw: RawDataset | None) -> float:
    """The FLOPs of one round as the method runs it: its second round (the first takes
    first-participation branches, and is not timed either) under torch's FlopCounterMode, run by
    the eager vectorized executor (whose batched ops count exactly what the sequential one's per-
    client ops do; padding is never computed eagerly)."""
    exp = load_experiment(None, [*args, "runtime.executor=vectorized", "runtime.compile=off"])
    sim = Simulation(exp, get_method_class(method), raw)
    sim.run_round()
    with FlopCounterMode(display=False) as counter:
        sim.run_round()
    return float(counter.get_total_flops())


def time_rounds(sim: Simulation, repeats: int) -> tuple[float, float]:
    """(first round's seconds, median of the next `repeats`): the first round warms up (allocations,
    first-participation branches) and, under runtime.compile, compiles the steps."""
    sync(sim.device)
    start = time.perf_counter()
    sim.run_round()
    sync(sim.device)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        sync(sim.device)
        start = time.perf_counter()
        sim.run_round()
        sync(sim.device)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def pays_at_round(compile_s: float, eager_s: float, compiled_s: float) -> float:
    """The round at which compiling has paid for itself: compile time over the saving per round
    (inf when the compiled round is not faster)."""
    saving = eager_s - compiled_s
    return math.ceil(max(compile_s, 0.0) / saving) if saving > 0 else math.inf


def bench(method: str, scenario: str, executors: list[str], extra: list[str], repeats: int,
          flops_per_s: float, raw: RawDataset | None = None, compile_modes: list[str | None] = [None]
          ) -> dict[str, float]:
    seconds: dict[str, float] = {}
    args = round_args(scenario, method, *extra)
    floor = round_flops(method, args, raw) / flops_per_s
    for executor in executors:
        for mode in compile_modes:
            label = executor if mode is None else f"{executor}/{mode}"
            exp = load_experiment(None, [*args, f"runtime.executor={executor}",
                                         *([f"runtime.compile={mode}"] if mode else [])])
            sim = Simulation(exp, get_method_class(method), raw)
            first, seconds[label] = time_rounds(sim, repeats)
            seconds[f"{label}:first"] = first
            print(f"{scenario} {method:10s} {label:10s} round_s {seconds[label]:7.3f}  floor_s {floor:8.4g}  "
                  f"x_floor {seconds[label] / floor:6.2f}  first_round_s {first:7.2f}  "
                  f"({sim.executor_line}; threads {torch.get_num_threads()})", flush=True)
        if len(compile_modes) == 1:
            seconds[executor] = seconds[label]
        if compile_modes == ["off", "on"]:
            eager, comp = seconds[f"{executor}/off"], seconds[f"{executor}/on"]
            # compile time: the compiled run's first round beyond the eager run's first round
            compile_s = seconds[f"{executor}/on:first"] - seconds[f"{executor}/off:first"]
            seconds[executor] = min(eager, comp)
            print(f"compile[{method} {executor}] compile_s {compile_s:.1f}  eager_round_s {eager:.3f}  "
                  f"compiled_round_s {comp:.3f}  pays_at_round {pays_at_round(compile_s, eager, comp)}", flush=True)
    if len(executors) == 2:
        seconds["speedup"] = seconds["sequential"] / seconds["vectorized"]
        print(f"speedup[{method}] {seconds['speedup']:.2f}", flush=True)
    seconds["floor"] = floor
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="fedfcd-t1", choices=sorted(SCENARIOS))
    parser.add_argument("--method", default="fedavg", help="a registered method, several joined by commas, or `all`")
    parser.add_argument("--executor", default="both", choices=["sequential", "vectorized", "both"])
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (the median is reported)")
    parser.add_argument("--device", default="cpu", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--synthetic", action="store_true",
                        help="random tensors of the scenario dataset's shape instead of its files")
    parser.add_argument("--compile", choices=["off", "on", "auto", "both"], default=None,
                        help="runtime.compile of the timed runs (default: the config's, auto); both = off then on, "
                        "with the compile time and the round at which compiling pays")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--peer", type=Path, default=None, metavar="PFLLIB",
                        help="a PFLlib checkout: after autofl's rounds, time PFLlib's own rounds of the same "
                        "methods on fedfcd-t1 (scripts/peer_pfllib.py) and print autofl's speedup over them")
    args = parser.parse_args()
    if args.peer is not None and args.scenario != "fedfcd-t1":
        parser.error("--peer: PFLlib is timed on fedfcd-t1 only (allowed: --scenario fedfcd-t1)")
    executors = ["sequential", "vectorized"] if args.executor == "both" else [args.executor]
    device = resolve_device(args.device)
    flops_per_s = matmul_flops_per_second(device)
    print(f"matmul {flops_per_s / 1e9:.1f} GFLOP/s on {device}", flush=True)
    methods = method_names() if args.method == "all" else args.method.split(",")
    raw = None
    if args.synthetic:
        dataset = load_experiment(None, [*SCENARIOS[args.scenario], *args.set]).data.dataset
        raw = synthetic_dataset(dataset)
        print(f"synthetic {dataset}: {len(raw.train_y)} train + {len(raw.test_y)} test of shape {raw.input_shape}")
    results = {m: bench(m, args.scenario, executors, [f"runtime.device={args.device}", *args.set], args.repeats,
                        flops_per_s, raw, ["off", "on"] if args.compile == "both" else [args.compile])
               for m in methods}
    print("| method | " + " | ".join(f"{e} s" for e in executors) + " | floor s | "
          + ("speedup |" if len(executors) == 2 else "x floor |"))
    for m, r in results.items():
        cells = [f"{r[e]:.3f}" for e in executors] + [f"{r['floor']:.4g}"]
        cells.append(f"{r['speedup']:.2f}" if len(executors) == 2 else f"{r[executors[0]] / r['floor']:.2f}")
        print(f"| {m} | " + " | ".join(cells) + " |")
    if len(executors) == 2:
        worst = min(results, key=lambda m: results[m]["speedup"])
        print(f"min_speedup {worst} {results[worst]['speedup']:.2f}")
    else:
        worst = max(results, key=lambda m: results[m][executors[0]] / results[m]["floor"])
        print(f"worst_x_floor {worst} {results[worst][executors[0]] / results[worst]['floor']:.2f}")
    if args.peer is not None:
        peer(args.peer, results, executors)


def peer(pfllib: Path, results: dict[str, dict[str, float]], executors: list[str]) -> None:
    """PFLlib's rounds of the timed methods, in the same run: `peer[METHOD] pfllib ALGO round_s ..` and
    autofl's speedup over it for each executor timed (its fastest mode when --compile both)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import peer_pfllib

    data_root = os.environ.get("AUTOFL_DATA_ROOT")
    if not data_root:
        sys.exit("--peer: set AUTOFL_DATA_ROOT to the folder holding FashionMNIST/raw")
    peer_pfllib.generate(pfllib, Path(data_root))
    for method, r in results.items():
        algo = PFLLIB_PEERS.get(method)
        if algo is None:
            print(f"peer[{method}] none: PFLlib has no such method", flush=True)
            continue
        seconds = peer_pfllib.median_round(pfllib, algo)[0]
        ratios = "  ".join(f"speedup_{e} {seconds / r[e]:.2f}" for e in executors)
        print(f"peer[{method}] pfllib {algo} round_s {seconds:.3f}  {ratios}", flush=True)


if __name__ == "__main__":
    main()

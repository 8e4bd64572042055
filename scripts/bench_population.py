"""Config-rounds per second of population trials against the population's width C.

    python scripts/bench_population.py [--method fedavg] [--widths 1,4,16] [--rounds 3] [--repeats 3]
                                       [--clients 10] [--batch-size 10] [--dtype float32] [--device cpu]
                                       [--set key=value ...]

For each width C, C configs of `--method` on scikit-learn digits (mlp, dirichlet(0.5), every client
sampled each round; no download) that differ in fl.lr and in each fusible method parameter are
trained for `--rounds` rounds as one population (`autofl.population.Population`); C = 1 is a config
trained alone (the vectorized executor, eager), what one trial runs today. Only the last round is
evaluated. Prints per width the median over `--repeats` runs, in one process, of the wall time of
the rounds and of the setup (data, models), and config-rounds per second = C x rounds / rounds' time,
then the speedup over C = 1. Timings only: no test reads them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from autofl.config import fusible_fields
from autofl.data.datasets import load_raw_dataset
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class
from autofl.population import Population


def experiments(args: argparse.Namespace, width: int) -> list:
    base = [
        f"method.name={args.method}",
        "data.dataset=digits",
        f"data.num_clients={args.clients}",
        "data.partition.kind=dirichlet",
        f"fl.rounds={args.rounds}",
        f"fl.eval_every={args.rounds}",
        f"fl.batch_size={args.batch_size}",
        "fl.participation=1.0",
        f"runtime.dtype={args.dtype}",
        f"runtime.device={args.device}",
        "runtime.executor=vectorized",
        "runtime.compile=off",
        *args.set,
    ]
    cls = get_method_class(args.method)
    first = load_experiment(None, base)
    out = []
    for i in range(width):
        scale = 1.0 + 0.5 * i / max(width - 1, 1)  # 1 .. 1.5: distinct values for every member
        params = [f"method.{n}={first.method.params()[n] * scale}" for n in fusible_fields(cls.Params)]
        out.append(load_experiment(None, [*base, f"fl.lr={first.fl.lr * scale}", *params]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--widths", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--set", action="append", default=[], help="an extra key=value for every member")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    raw = load_raw_dataset(load_experiment(None, []).data)
    print(
        f"method {args.method}, digits mlp, {args.clients} clients, batch {args.batch_size}, {args.rounds} rounds, "
        f"{args.dtype} on {args.device}, torch threads {torch.get_num_threads()}, median of {args.repeats}"
    )
    rates: dict[int, float] = {}
    for width in widths:
        setups, runs = [], []
        for _ in range(args.repeats):
            exps = experiments(args, width)
            start = time.perf_counter()
            pop = Population(exps, raw)
            setups.append(time.perf_counter() - start)
            start = time.perf_counter()
            pop.run()
            runs.append(time.perf_counter() - start)
        run_s, setup_s = statistics.median(runs), statistics.median(setups)
        rates[width] = width * args.rounds / run_s
        print(
            f"C={width:3d}  rounds_s {run_s:8.3f}  setup_s {setup_s:7.3f}  config_rounds_per_s {rates[width]:8.2f}  "
            f"speedup_vs_C1 {rates[width] / rates.get(1, rates[widths[0]]):5.2f}"
        )


if __name__ == "__main__":
    main()

"""Config-rounds per second of population trials against the population's width C.

    python scripts/bench_population.py [--scenario digits|fedfcd-t1|fmnist-cnn|cifar10-cnn] [--synthetic]
                                       [--method fedavg] [--widths 1,4,16] [--repeats 3] [--dtype float32]
                                       [--device cpu|cuda] [--compile off|on|auto] [--set key=value ...]

For each width C, C configs of `--method` on a scenario of `scripts/bench_round.py` (default digits:
mlp, dirichlet(0.5), 10 clients, no download; `--synthetic`: random tensors of the scenario dataset's
shape, for a machine without its files) that differ in fl.lr and in each fusible method parameter are
trained as one population (`autofl.population.Population`); C = 1 is a config trained alone by the
eager vectorized executor. `--compile on` (CPU) compiles the population's steps with inductor as a
study's cohort trials do (`autofl.population.population_compile`), and C = 1 then is one config alone
compiled; on CUDA a population's steps stay eager whatever it says. After one warm-up round (which
compiles), `--repeats` rounds are timed one by one (no evaluation in them). Prints per width the median
round's wall time, config-rounds per second (C / round time) and the speedup over C = 1; then `trial` —
one config as a trial trains it today (`runtime.compile: auto`: CUDA graphs on a GPU, inductor or eager on
a CPU) — and each width's speedup over it. Timings only: no test reads them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_round import SCENARIOS, sync, synthetic_dataset  # noqa: E402

from autofl.config import fusible_fields  # noqa: E402
from autofl.data.datasets import load_raw_dataset  # noqa: E402
from autofl.engine.simulation import Simulation  # noqa: E402
from autofl.experiment import load_experiment  # noqa: E402
from autofl.methods.registry import get_method_class  # noqa: E402
from autofl.population import Population  # noqa: E402


def base_args(args: argparse.Namespace) -> list[str]:
    return [
        *SCENARIOS[args.scenario],
        f"method.name={args.method}",
        "fl.rounds=1000",
        "fl.eval_every=1000",
        f"runtime.dtype={args.dtype}",
        f"runtime.device={args.device}",
        "runtime.executor=vectorized",
        *args.set,
    ]


def experiments(args: argparse.Namespace, width: int) -> list:
    base = [*base_args(args), f"runtime.compile={args.compile}"]
    cls = get_method_class(args.method)
    first = load_experiment(None, base)
    out = []
    for i in range(width):
        scale = 1.0 + 0.5 * i / max(width - 1, 1)  # 1 .. 1.5: distinct values for every member
        params = [f"method.{n}={first.method.params()[n] * scale}" for n in fusible_fields(cls.Params)]
        out.append(load_experiment(None, [*base, f"fl.lr={first.fl.lr * scale}", *params]))
    return out


def time_rounds(run_round, device: torch.device, repeats: int) -> float:
    """The median of `repeats` rounds' wall time, after one warm-up round."""
    run_round()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run_round()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="digits", choices=sorted(SCENARIOS))
    parser.add_argument("--synthetic", action="store_true", help="random tensors of the scenario dataset's shape")
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--widths", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", default="off", choices=["off", "on", "auto"], help="the members' runtime.compile")
    parser.add_argument("--no-trial", action="store_true", help="skip the one-config trial as it runs today")
    parser.add_argument("--set", action="append", default=[], help="an extra key=value for every member")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    data = load_experiment(None, base_args(args)).data
    raw = synthetic_dataset(data.dataset) if args.synthetic else load_raw_dataset(data)
    device = torch.device(args.device)
    print(
        f"method {args.method}, {args.scenario}{' (synthetic)' if args.synthetic else ''}, {args.dtype} on "
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
        f"torch threads {torch.get_num_threads()}, runtime.compile={args.compile}, median of {args.repeats} rounds",
        flush=True,
    )
    rates: dict[int, float] = {}
    for width in widths:
        start = time.perf_counter()
        pop = Population(experiments(args, width), raw)
        setup_s = time.perf_counter() - start
        round_s = time_rounds(pop.run_round, device, args.repeats)
        rates[width] = width / round_s
        print(
            f"C={width:3d}  round_s {round_s:8.3f}  setup_s {setup_s:7.3f}  config_rounds_per_s {rates[width]:8.2f}  "
            f"speedup_vs_C1 {rates[width] / rates.get(1, rates[widths[0]]):6.2f}",
            flush=True,
        )
        del pop
    if not args.no_trial:
        exp = load_experiment(None, [*base_args(args), "runtime.compile=auto"])
        sim = Simulation(exp, get_method_class(args.method), raw)
        trial_s = time_rounds(sim.run_round, device, args.repeats)
        print(f"trial  round_s {trial_s:8.3f}  ({sim.executor_line})", flush=True)
        for width in widths:
            print(f"C={width:3d}  speedup_vs_trial {rates[width] * trial_s:6.2f}", flush=True)


if __name__ == "__main__":
    main()

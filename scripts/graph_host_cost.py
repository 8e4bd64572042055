"""The host's share of a round with CUDA-graph steps, measured on a machine without a GPU.

    python scripts/graph_host_cost.py [--scenario fedfcd-t1] [--method fedavg,fedrep|all] [--rounds 9]

On a GPU, a round whose whole steps replay as CUDA graphs (`runtime.compile`, accel/cuda_graphs.py) is
bound by the host: the executor's Python around each replay, and the steps that still run eagerly (a
`vmap(grad)` call is a few milliseconds of Python and kernel launches there). This script runs the
vectorized executor's graph branches on CPU with graphs that cost nothing: a capture runs the step's
Python once (as a real capture does, recording instead of running kernels), a replay does nothing. What
a round then takes is the host's work of a graphed round, plus the eager steps computed on the CPU
(their arithmetic is far slower there than on a GPU, so a round with many eager steps reads high). It
prints, per method, the median and fastest of `--rounds` rounds (after a first) and the eager
`vmap(grad)` calls a round makes (captures included), its captures and its graph replays. The data are random tensors of the scenario's
dataset (`--synthetic` of bench_round.py), so nothing is read from disk. It measures the executor's
bookkeeping, not a GPU: the GPU's own numbers come from `bench_round.py --device cuda`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_round  # noqa: E402

from autofl.accel import compiled, cuda_graphs  # noqa: E402
from autofl.engine.simulation import Simulation  # noqa: E402
from autofl.experiment import load_experiment  # noqa: E402
from autofl.methods.registry import get_method_class, method_names  # noqa: E402


class FreeGraph:
    def replay(self) -> None:
        pass


class HostOnlyGraphs(cuda_graphs.StepGraphs):
    """`StepGraphs` on CPU whose captures run the step once (its Python, as a capture does) and whose
    replays do nothing."""

    made: list["HostOnlyGraphs"] = []

    def __init__(self) -> None:
        super().__init__()
        HostOnlyGraphs.made.append(self)

    def _on_stream(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def _capture(self, entry: Any, rows: torch.Tensor, step: Callable[[torch.Tensor], Any]) -> None:
        entry.rows = rows.clone()
        entry.out = step(entry.rows)
        entry.graph = FreeGraph()
        self.captures += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="fedfcd-t1", choices=sorted(bench_round.SCENARIOS))
    parser.add_argument("--method", default="fedavg", help="a registered method, several joined by commas, or `all`")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds, after a first one")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    cuda_graphs.graphs_on = lambda device: True  # the executor takes its graph branches on CPU
    cuda_graphs.StepGraphs = HostOnlyGraphs
    calls = [0]
    batched_grads = compiled.batched_grads

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return batched_grads(*a, **k)

    compiled.batched_grads = counted
    dataset = load_experiment(None, [*bench_round.SCENARIOS[args.scenario], *args.set]).data.dataset
    raw = bench_round.synthetic_dataset(dataset)
    methods = method_names() if args.method == "all" else args.method.split(",")
    for method in methods:
        exp = load_experiment(None, bench_round.round_args(args.scenario, method, "runtime.executor=vectorized",
                                                           "runtime.compile=on", "runtime.device=cpu", *args.set))
        sim = Simulation(exp, get_method_class(method), raw)
        HostOnlyGraphs.made = []
        sim.run_round()
        calls[0] = 0
        # the executor keeps a step's graphs across rounds (accel/graph_arena.py): count from here on
        replays, captures = (sum(g.replays for g in HostOnlyGraphs.made), sum(g.captures for g in HostOnlyGraphs.made))
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            sim.run_round()
            times.append(time.perf_counter() - start)
        replays = sum(g.replays for g in HostOnlyGraphs.made) - replays
        captures = sum(g.captures for g in HostOnlyGraphs.made) - captures
        print(f"graph_host[{method}] round_s {statistics.median(times):.4f}  fastest_s {min(times):.4f}  "
              f"eager_vmap_calls_per_round {calls[0] / args.rounds:.1f}  "
              f"captures_per_round {captures / args.rounds:.1f}  replays_per_round {replays / args.rounds:.1f}",
              flush=True)


if __name__ == "__main__":
    main()

"""Time one FL round of a method against its compute floor.

The floor is the same number of forward+backward sample passes (and the method's extra no-grad
forwards) on one model in a tight loop, in the same process: what the SGD itself costs. The ratio
says how much the engine adds (sampling, state loading, aggregation, method bookkeeping).

    python scripts/bench_round.py [--method fedavg|all] [--repeats 3]

Scenario: fmnist from $AUTOFL_DATA_ROOT when present (cnn), else digits (mlp); 10 clients; E=1.
The last line printed is `ratio <number>` (with `--method all`: one line per method, then the
worst ratio).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from autofl.experiment import load_experiment
from autofl.engine.simulation import Simulation
from autofl.methods.registry import method_names


def scenario(method: str, extra: list[str]) -> list[str]:
    root = os.environ.get("AUTOFL_DATA_ROOT")
    has_fmnist = root is not None and (Path(root) / "FashionMNIST" / "raw").is_dir()
    data = ["data.dataset=fmnist", "model.arch=cnn"] if has_fmnist else ["data.dataset=digits", "model.arch=mlp"]
    return data + ["data.num_clients=10", "data.partition.kind=dirichlet", "fl.local_epochs=1", "fl.rounds=1000",
                   "fl.eval_every=1000", "fl.batch_size=32", f"method.name={method}", "runtime.device=cpu", *extra]


def time_round(sim: Simulation) -> float:
    start = time.perf_counter()
    sim.run_round()
    return time.perf_counter() - start


def batch_sizes(sim: Simulation) -> list[int]:
    """The batch sizes one round trains on (the same cut as ClientContext.batches)."""
    bs, sizes = sim.exp.fl.batch_size, []
    for cid in sim.sample_clients(sim.round):
        n = len(sim.data.clients[cid].train)
        for _ in range(sim.exp.fl.local_epochs):
            sizes += [min(bs, n - s) for s in range(0, n, bs) if min(bs, n - s) >= 2 or n < 2]
    return sizes


def time_floor(sim: Simulation) -> float:
    method = sim.method
    torch.manual_seed(0)
    model = method.build_model().to(sim.device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=sim.exp.fl.momentum)
    x_all, y_all = sim.data.x, sim.data.y
    sizes = batch_sizes(sim)
    idx = torch.randint(0, len(y_all), (sum(sizes),))
    start = time.perf_counter()
    offset = 0
    for size in sizes:
        x, y = x_all[idx[offset : offset + size]], y_all[idx[offset : offset + size]]
        offset += size
        with torch.no_grad():
            for _ in range(method.extra_forwards):
                model(x)
        for _ in range(method.train_passes):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return time.perf_counter() - start


def bench(method: str, overrides: list[str], repeats: int) -> float:
    """Print one method's round and floor times; return their ratio (medians over `repeats`)."""
    exp = load_experiment(None, scenario(method, overrides))
    sim = Simulation(exp)
    sim.run_round()  # warm-up (allocations, first-participation branches)
    rounds, floors = [], []
    for _ in range(repeats):
        floors.append(time_floor(sim))
        rounds.append(time_round(sim))
    r, f = statistics.median(rounds), statistics.median(floors)
    print(f"scenario {exp.data.dataset}/{exp.model.arch}, {exp.data.num_clients} clients, E={exp.fl.local_epochs}, "
          f"method {exp.method.name}, threads {torch.get_num_threads()}")
    print(f"round_seconds {r:.3f}")
    print(f"floor_seconds {f:.3f}  ({method_passes(sim)})")
    return r / f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="fedavg", help="a registered method, or `all`")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median is reported)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.method != "all":
        print(f"ratio {bench(args.method, args.set, args.repeats):.3f}")
        return
    ratios = {}
    for name in method_names():
        ratios[name] = bench(name, args.set, args.repeats)
        print(f"ratio[{name}] {ratios[name]:.3f}", flush=True)
    worst = max(ratios, key=ratios.__getitem__)
    print(f"worst {worst}")
    print(f"ratio {ratios[worst]:.3f}")


def method_passes(sim: Simulation) -> str:
    m = sim.method
    return f"{m.train_passes} fwd+bwd and {m.extra_forwards} no-grad forwards per sample"


if __name__ == "__main__":
    main()

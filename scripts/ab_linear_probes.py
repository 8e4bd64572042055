"""A/B of the probed linear-weight update (autofl/engine/linear_probes.py) in one process.

    python scripts/ab_linear_probes.py --method fedavg [--scenario fedfcd-t1] [--rounds 6]

One compiled vectorized simulation runs its rounds alternately with the probes and without (every
probe plan empty: autograd's weight gradients and the SGD update, as before probing). Each variant
compiles as its own function, so neither pays the other's failed guard checks, and alternating
rounds exposes both to the same host noise (on this project's shared 2-core VM, fresh processes a
minute apart differed by up to 30%). After two warm-up rounds of each, prints the median and the
fastest of `--rounds` rounds per variant and their ratios (probed / unprobed: below 1 is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_round import SCENARIOS

from autofl.engine import compiled, vectorized
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class

_probed = {"on": True}
_plan, _key = vectorized.probe_plan, compiled.step_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True)
    parser.add_argument("--scenario", default="fedfcd-t1", choices=sorted(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    vectorized.probe_plan = lambda *a, **k: _plan(*a, **k) if _probed["on"] else ()
    compiled.step_key = lambda loss, stage, update: (_key(loss, stage, update), _probed["on"])
    exp = load_experiment(None, [*SCENARIOS[args.scenario], f"method.name={args.method}", "fl.rounds=1000",
                                 "fl.eval_every=1000", "runtime.executor=vectorized", "runtime.compile=on"])
    sim = Simulation(exp, get_method_class(args.method), None)
    times: dict[bool, list[float]] = {True: [], False: []}
    for probed in (True, False):
        _probed["on"] = probed
        sim.run_round()
        sim.run_round()
    for _ in range(args.rounds):
        for probed in (True, False):
            _probed["on"] = probed
            start = time.perf_counter()
            sim.run_round()
            times[probed].append(time.perf_counter() - start)
    med = {p: statistics.median(t) for p, t in times.items()}
    low = {p: min(t) for p, t in times.items()}
    print(f"ab[{args.method}] probed_s {med[True]:.3f} unprobed_s {med[False]:.3f} ratio {med[True] / med[False]:.3f}  "
          f"fastest {low[True]:.3f} {low[False]:.3f} ratio {low[True] / low[False]:.3f}")


if __name__ == "__main__":
    main()

"""A/B of one executor switch in one process: a round with it against a round without.

    python scripts/ab_round.py --switch probes|unstacked|inputs|calls|simd --method fedavg
                               [--scenario fedfcd-t1] [--rounds 6] [--device cpu|cuda] [--synthetic]

Switches (all on by default in autofl; "off" is what the executor did before them):
  probes     the probed linear-weight update (autofl/accel/linear_probes.py); off: every probe plan
             empty, autograd's weight gradients and the SGD update
  unstacked  received, not yet trained parameters read once, unstacked (vectorized._ChunkRun._enter_stage);
             off: every stacked tensor read as its stack
  inputs     a stage's `inputs` module computed once for the stage (executor.stage_inputs; DualFed's
             stage 2, FedRep's head epochs); off: computed batch by batch inside each step
  calls      small whole steps run several to a compiled call (compiled.steps_per_call); off: one step a call
  simd       those calls compiled with compiled.small_step_options (256-bit vectors on AVX-512); off:
             inductor's default width

`--device cuda` times the CUDA-graph steps, where only `unstacked` and `inputs` change anything (probes,
calls and simd are options of the CPU's compiled steps); `--synthetic` as in bench_round.py.

One compiled vectorized simulation per variant, run alternately round by round, so both see the same
host noise (on this project's shared 2-core VMs, fresh processes a minute apart differed by up to
30%). Each variant compiles as its own function, so neither pays the other's failed guard checks.
After two warm-up rounds of each, prints the median and the fastest of `--rounds` rounds per variant
and their ratios (on / off: below 1 is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_round import SCENARIOS, round_args, sync, synthetic_dataset

from autofl.accel import compiled, vectorized
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class

_on = {"on": True}
_plan, _key, _stack = vectorized.probe_plan, compiled.step_key, vectorized._ChunkRun._stack_state
_inputs, _per_call = vectorized.stage_inputs, compiled.steps_per_call
_small = compiled.small_step_options


def switch(name: str) -> None:
    """Make `name` follow `_on` (the step keys too: each variant compiles its own steps)."""
    compiled.step_key = lambda loss, stage, update: (_key(loss, stage, update), _on["on"])
    if name == "probes":
        vectorized.probe_plan = lambda *a, **k: _plan(*a, **k) if _on["on"] else ()
    elif name == "calls":
        compiled.steps_per_call = lambda step, clients: _per_call(step, clients) if _on["on"] else 1
    elif name == "simd":
        compiled.small_step_options = lambda device: _small(device) if _on["on"] else None
    elif name == "inputs":
        vectorized.stage_inputs = lambda ws, stage: _inputs(ws, stage) if _on["on"] else None
    else:
        def stack_state(self: vectorized._ChunkRun) -> tuple:
            state, batched, common = _stack(self)
            return state, batched, common if _on["on"] else {}

        vectorized._ChunkRun._stack_state = stack_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", choices=("probes", "unstacked", "inputs", "calls", "simd"), default="probes")
    parser.add_argument("--method", required=True)
    parser.add_argument("--scenario", default="fedfcd-t1", choices=sorted(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--synthetic", action="store_true", help="random tensors of the dataset's shape (bench_round.py)")
    args = parser.parse_args()
    raw = (synthetic_dataset(load_experiment(None, SCENARIOS[args.scenario]).data.dataset) if args.synthetic
           else None)
    switch(args.switch)
    sims = {}
    for on in (True, False):
        _on["on"] = on
        exp = load_experiment(None, round_args(args.scenario, args.method, "runtime.executor=vectorized",
                                               "runtime.compile=on", f"runtime.device={args.device}"))
        sims[on] = Simulation(exp, get_method_class(args.method), raw)
        sims[on].run_round()
        sims[on].run_round()
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for on, sim in sims.items():
            _on["on"] = on
            sync(sim.device)
            start = time.perf_counter()
            sim.run_round()
            sync(sim.device)
            times[on].append(time.perf_counter() - start)
    med = {on: statistics.median(t) for on, t in times.items()}
    low = {on: min(t) for on, t in times.items()}
    print(f"ab[{args.method} {args.switch}] on_s {med[True]:.3f} off_s {med[False]:.3f} "
          f"ratio {med[True] / med[False]:.3f}  fastest {low[True]:.3f} {low[False]:.3f} "
          f"ratio {low[True] / low[False]:.3f}")


if __name__ == "__main__":
    main()

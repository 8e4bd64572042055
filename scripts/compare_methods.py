"""Run the personalized methods and the baselines on one scenario and print a comparison table.

    python scripts/compare_methods.py [--config FILE] [--set key=value ...] [--seeds 0 1 2]
                                      [--methods fedavg fdcl ...] [--json results.json]

Each method runs with its own defaults on the scenario (config + overrides, `method.*` keys are
dropped); the table shows mean ± std over seeds of the final and best personal_test_acc, the final
global_test_acc (methods with a global model) and seconds per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from autofl.config import apply_overrides, read_yaml
from autofl.experiment import build_experiment
from autofl.data.datasets import load_raw_dataset
from autofl.engine.simulation import Simulation
from autofl.features import ClassStats
from autofl.methods.registry import get_method_class, method_names

DEFAULT_METHODS = ["fedavg", "fedprox", "fedper", "moon", "fdcl", "fedeccr", "dualfed", "fedsiam_da", "fedfcd"]


def run_one(raw_cfg: dict, method: str, seed: int, raw_data, progress_every: int = 0,
            checkpoint: Path | None = None, checkpoint_every: int = 10) -> dict:
    """One method's run; with `progress_every` N, a line `METHOD seed S round R ... s/round` every N
    evaluated rounds (a long run cut off by a time limit still says how far it got). With `checkpoint`
    (a file), the run's state is saved there every `checkpoint_every` rounds and a run that finds the
    file continues from it (a killed run loses at most that many rounds); the caller removes it once
    it has kept the finished run."""
    cfg = dict(raw_cfg, seed=seed, method={**raw_cfg.get("method", {}), "name": method})  # keeps given params
    model = dict(cfg.get("model", {}))

    if not get_method_class(method).uses_projector:  # projector keys belong to projector methods only
        model.pop("projector_depth", None)
        model.pop("projector_dim", None)
    cfg["model"] = model
    exp = build_experiment(cfg)
    sim = Simulation(exp, get_method_class(exp.method.name), raw=raw_data)
    if checkpoint is not None and checkpoint.exists():
        with torch.serialization.safe_globals([ClassStats]):
            sim.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
        print(f"{method} seed {seed}: continues from round {sim.round} ({checkpoint})", flush=True)
    start, first = time.perf_counter(), sim.round
    history = list(sim.history)
    for metrics in sim.run():
        history.append(metrics)
        if checkpoint is not None and sim.round % checkpoint_every == 0 and not sim.done():
            torch.save(sim.state_dict(), checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        if progress_every and len(history) % progress_every == 0:
            print(f"{method} seed {seed} round {metrics['round']} personal_test_acc "
                  f"{metrics.get('personal_test_acc', float('nan')):.4f} "
                  f"{(time.perf_counter() - start) / (metrics['round'] - first):.3f} s/round ({sim.executor_line})",
                  flush=True)
    seconds = (time.perf_counter() - start) / max(exp.fl.rounds - first, 1)
    last = history[-1]
    return {
        "method": method, "seed": seed,
        "final_personal_test_acc": last["personal_test_acc"],
        "best_personal_test_acc": max(m["personal_test_acc"] for m in history),
        "final_global_test_acc": last.get("global_test_acc"),
        "seconds_per_round": seconds,
        "history": history,
    }


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * std:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=method_names())
    parser.add_argument("--json", help="write every run (with its round history) to this file")
    args = parser.parse_args()
    raw_cfg = apply_overrides(read_yaml(args.config) if args.config else {}, args.set)
    raw_cfg.pop("method", None)
    raw_data = load_raw_dataset(build_experiment(raw_cfg).data)
    runs = []
    for method in args.methods:
        for seed in args.seeds:
            runs.append(run_one(raw_cfg, method, seed, raw_data))
            r = runs[-1]
            print(f"  {method} seed {seed}: final {r['final_personal_test_acc']:.4f} "
                  f"({r['seconds_per_round']:.2f} s/round)", flush=True)
    header = f"{'method':<12}{'final personal_test_acc':>26}{'best personal_test_acc':>26}" \
             f"{'final global_test_acc':>26}{'s/round':>10}"
    print(header)
    print("-" * len(header))
    for method in args.methods:
        rs = [r for r in runs if r["method"] == method]
        glob = [r["final_global_test_acc"] for r in rs if r["final_global_test_acc"] is not None]
        print(f"{method:<12}{mean_std([r['final_personal_test_acc'] for r in rs]):>26}"
              f"{mean_std([r['best_personal_test_acc'] for r in rs]):>26}{mean_std(glob):>26}"
              f"{statistics.mean(r['seconds_per_round'] for r in rs):>10.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"scenario": raw_cfg, "seeds": args.seeds, "runs": runs}, fh, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

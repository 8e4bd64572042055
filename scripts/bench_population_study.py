"""Wall time and best value of one real study run with population trials against one config per trial.

    AUTOFL_DATA_ROOT=... python scripts/bench_population_study.py [--space search_spaces/fedfcd.yaml]
        [--trials 40] [--populations 1,auto] [--repeats 1] [--dir /tmp/bench-population-study]
        [--warm-cache] [--set resources.cpu=1 ...]

For each `resources.population` value the space (its `trials` set to `--trials`, each `--set` applied
to its top-level sections) runs as a new study through `autofl search`, end to end: Ray's start, the
dry round of `auto`, every trial, the driver's exit. Prints per value the wall time, the trials'
states, the best trial's value and params, the width `auto` chose, and the speedup over the first
value. The studies use the space's seed, so both propose the same first configs; ASHA's decisions
differ with the order in which trials reach their rungs. Repeats are interleaved (population 1, auto,
1, auto, ...), so a drift of the host's speed touches every value alike, and each study compiles into
an inductor cache of its own, empty at its start (`TORCHINDUCTOR_CACHE_DIR`), as a first study on a
machine does; `--warm-cache` shares one cache across the studies instead (inductor's default). The
table gives medians over the repeats of the wall time, the config-rounds ASHA trained and config-rounds
per second (the steadier measure: asynchronous ASHA's config-rounds move from run to run).
Timings only: no test reads them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import yaml

ROOT = Path(__file__).resolve().parent.parent


def space_with(path: Path, trials: int, population: str, sets: list[str]) -> dict:
    tree = yaml.safe_load(path.read_text())
    tree["trials"] = trials
    tree.setdefault("resources", {})["population"] = population if population == "auto" else int(population)
    for item in sets:
        key, value = item.split("=", 1)
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return tree


def run_study(tree: dict, home: Path, name: str, warm_cache: bool) -> tuple[float, str]:
    space = home / f"{name}.yaml"
    space.write_text(yaml.safe_dump(tree))
    env = dict(os.environ)
    if not warm_cache:  # inductor's cache of this study alone, empty at its start
        env["TORCHINDUCTOR_CACHE_DIR"] = str(home / f"{name}-inductor-cache")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "autofl.cli", "search", "--space", str(space), "--dir", str(home), "--name", name],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"study {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    found = re.search(r"resources\.population: auto = .*?slot\(s\)\)", proc.stdout)
    return wall, found.group(0) if found else ""


def summary(home: Path, name: str) -> tuple[dict[str, int], float, dict, int]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{home / name / 'optuna.db'}")
    trials = study.get_trials()
    states: dict[str, int] = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    rounds = sum(max(t.intermediate_values, default=0) for t in trials)
    return states, study.best_value, study.best_params, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", type=Path, default=ROOT / "search_spaces" / "fedfcd.yaml")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--populations", default="1,auto")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-population-study"))
    parser.add_argument("--warm-cache", action="store_true", help="one inductor cache for every study")
    parser.add_argument("--set", action="append", default=[], help="key=value in the space, e.g. resources.cpu=1")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    populations = args.populations.split(",")
    runs: dict[str, list[tuple[float, int, float, str]]] = {p: [] for p in populations}  # wall, rounds, best, chosen
    for r in range(args.repeats):
        for population in populations:
            name = f"p{population}-{r}"
            tree = space_with(args.space, args.trials, population, args.set)
            wall, chosen = run_study(tree, args.dir, name, args.warm_cache)
            states, best, params, rounds = summary(args.dir, name)
            runs[population].append((wall, rounds, best, chosen))
            print(
                f"population {population} repeat {r}: {wall:.1f} s, {rounds} config-rounds "
                f"({rounds / wall:.2f}/s), {states}, best {best:.4f} {params} {chosen}",
                flush=True,
            )
    medians = {
        p: (
            statistics.median(w for w, _, _, _ in rs),
            statistics.median(n for _, n, _, _ in rs),
            statistics.median(n / w for w, n, _, _ in rs),
        )
        for p, rs in runs.items()
    }
    wall0, _, rate0 = medians[populations[0]]
    cache = "one shared inductor cache" if args.warm_cache else "each study's inductor cache empty at its start"
    print(f"\n{args.trials} trials of {args.space.name}, medians of {args.repeats} interleaved runs, {cache}:\n")
    print(
        "| population | wall time (s) | speedup | config-rounds | config-rounds/s | speedup in config-rounds/s "
        "| best value (each run) | auto chose (each run) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for p, rs in runs.items():
        wall, rounds, rate = medians[p]
        bests = ", ".join(f"{best:.4f}" for _, _, best, _ in rs)
        chosen = "; ".join(c.split(":", 1)[-1].strip() for _, _, _, c in rs if c) or "-"
        print(
            f"| {p} | {wall:.1f} | {wall0 / wall:.2f} | {rounds:g} | {rate:.2f} | {rate / rate0:.2f} | {bests} | {chosen} |"
        )


if __name__ == "__main__":
    main()

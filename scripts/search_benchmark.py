"""How good is autofl's search? A tabular benchmark: every config of a grid trained once, then
every sampler x scheduler replayed against the table.

    python scripts/search_benchmark.py build  --task digits-fdcl      # about a minute a digits table (populations)
    python scripts/search_benchmark.py build  --space my.yaml --out-dir tables   # a table of your own grid
    python scripts/search_benchmark.py build  --space my.yaml --out-dir tables --shard 0/2  # and 1/2 beside it
    python scripts/search_benchmark.py replay [--task T ...] [--seeds 30]   # minutes, no training
    python scripts/search_benchmark.py replay --tables tables --task my --objective p10 --noise both
    python scripts/search_benchmark.py report                          # PNG + markdown from the replay
    python scripts/search_benchmark.py noise-report --replays A.json B.json   # regret by validation noise
    python scripts/search_benchmark.py describe --tables scripts/search_benchmark/large   # each table's spread
    python scripts/search_benchmark.py live   --task digits-fdcl --budget 0.25   # one real `autofl search`

A task is a search-space file (under scripts/search_benchmark/, or a user's with --space) whose every
param is a categorical grid, so the grid is the whole space. `build` trains each grid config for the
full round count on the table's seeds (0: what a search sees; 1000, 1001: what `autofl export
--reeval 2` would run) with the partition fixed (data.seed), a seed's configs that share their
non-fusible values together as populations (autofl.population), storing every round's validation and
test accuracy and every client's correct predictions behind them, and writes `<task>.json.gz` with
the command and settings that built it. `replay` runs each search
method against the table with the live study's own parts: the sampler from
autofl.tuning.strategy.build.make_sampler, the define-by-run space, and the ASHA rung rule of
autofl.tuning.strategy.asha; compute is counted in client-rounds (rounds x clients trained), and a
method's budget is a fraction of the grid's compute (every config, one seed, all rounds).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "search_benchmark"
TASKS = ("digits-fdcl", "digits-fedprox", "fmnist-fdcl", "fmnist-fedprox")
TABLE_SEEDS = (0, 1000, 1001)  # the search's seed, then autofl's re-evaluation seeds (SEED_OFFSET + k)
VAL_KEY, TEST_KEY = "personal_val_acc", "personal_test_acc"


def bad_input(message: str) -> SystemExit:
    """One line naming the bad option and what it allows, on stderr; exit code 2 (as argparse's own)."""
    print(message, file=sys.stderr)
    return SystemExit(2)


# ----------------------------------------------------------------------------------------- tables
def tables_dir() -> Path:
    """Where tables and their space files are read (AUTOFL_BENCH_TABLES: another folder of tables,
    e.g. a test's or a user's `build --space FILE --out-dir DIR`; default: the shipped ones)."""
    return Path(os.environ.get("AUTOFL_BENCH_TABLES", HERE))


def task_space(task: str):
    from autofl.tuning.strategy.space import load_space

    path = tables_dir() / f"{task}.yaml"
    return load_space(path if path.is_file() else HERE / f"{task}.yaml")


def grid_configs(space) -> list[dict[str, Any]]:
    """Every combination of the space's categorical choices, in a fixed order."""
    keys = list(space.params)
    for key in keys:
        if space.params[key].type != "categorical":
            raise bad_input(f"{key}: type {space.params[key].type}; a benchmark task's params are grids, "
                            f"allowed: type categorical")
    return [dict(zip(keys, values)) for values in itertools.product(*(space.params[k].choices for k in keys))]


def tables_in(folder: Path) -> list[str]:
    """The task names of the tables (`NAME.json.gz`) in `folder`, sorted."""
    return sorted(p.name[: -len(".json.gz")] for p in folder.glob("*.json.gz"))


def table_path(task: str) -> Path:
    return tables_dir() / f"{task}.json.gz"


def load_table(task: str) -> dict[str, Any]:
    path = table_path(task)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return json.load(fh)
    except (EOFError, OSError, ValueError) as err:  # cut short, not gzip, not JSON (ValueError: JSONDecodeError)
        raise bad_input(f"--task {task}: {path} is not a whole table ({type(err).__name__}: {err}); "
                        "rebuild it with the build command its space file names") from None


def _record(exp, history: list[dict[str, Any]], counts: list[Any], diverged: int | None) -> dict[str, Any]:
    """One run's row of a table: every evaluated round's mean validation and test accuracy and every
    client's correct predictions behind them (with the clients' split sizes, the same every round)."""
    sizes = counts[0] if counts else None
    return {"rounds": [int(m["round"]) for m in history],
            "val": [round(float(m[VAL_KEY]), 5) for m in history],
            "test": [round(float(m[TEST_KEY]), 5) for m in history],
            "val_correct": [c.val_correct for c in counts], "test_correct": [c.test_correct for c in counts],
            "val_sizes": sizes.val_sizes if sizes else [], "test_sizes": sizes.test_sizes if sizes else [],
            "diverged_at": diverged, "clients_per_round": exp.clients_per_round()}


def _train_group(space, group: list[dict[str, Any]], raw) -> list[dict[str, Any]]:
    """The runs of `group` (a seed's configs that share every non-fusible value: one population,
    `autofl.population`; each member's rounds are those it gives trained alone), as table rows. A
    member that diverges (a non-finite training loss) is dropped at that round."""
    from autofl.experiment import build_experiment
    from autofl.population import Population

    exps = [build_experiment(space.config(values)) for values in group]
    population = Population(exps, raw=raw)
    alive = list(range(len(exps)))
    histories: list[list[dict[str, Any]]] = [[] for _ in exps]
    counts: list[list[Any]] = [[] for _ in exps]
    diverged: list[int | None] = [None] * len(exps)
    while alive and not population.done():
        results = population.run_round()
        for k, (i, metrics) in enumerate(zip(alive, results)):  # member i is the population's k-th now
            if metrics is not None:
                histories[i].append(metrics)
                counts[i].append(population.sims[k].client_counts)
                if not math.isfinite(metrics["train_loss"]):
                    diverged[i] = int(metrics["round"])
        keep = [k for k, i in enumerate(alive) if diverged[i] is None]
        if len(keep) < len(alive):
            alive = [alive[k] for k in keep]
            if alive:
                population.keep(keep)
    return [_record(exp, h, c, d) for exp, h, c, d in zip(exps, histories, counts, diverged)]


def read_runs(partial: Path) -> list[str]:
    """The lines of a resume file (gzip members appended one per population) up to where a kill cut it:
    a member cut short ends the reading there, and its last line, if cut, fails to parse later."""
    import zlib

    lines: list[str] = []
    try:
        with gzip.open(partial, "rt", encoding="utf-8") as fh:
            for line in fh:
                lines.append(line)
    except (EOFError, gzip.BadGzipFile, zlib.error):
        pass  # the member being written when the build was killed
    return lines


def resume_files(out_dir: Path, name: str) -> list[Path]:
    """The resume files of table `name` in `out_dir`: an unsharded build's and every shard's."""
    return sorted({*out_dir.glob(f".{name}.runs.jsonl.gz"), *out_dir.glob(f".{name}.shard-*-of-*.runs.jsonl.gz")})


def build_table(space, name: str, out_dir: Path, seeds: tuple[int, ...], width: int, command: str,
                shard: tuple[int, int] = (0, 1)) -> Path | None:
    """Train every grid config of `space` on `seeds`, a seed's configs that share their non-fusible
    values together as populations of at most `width`; write `<out_dir>/<name>.json.gz`. Finished
    runs are kept in `.<name>.runs.jsonl.gz` beside it (one gzip member appended per population, a few
    MB for a whole large table), so a killed build resumes where it was, and a build's partial file can
    be committed beside its space to continue on another machine.

    `shard` (i, n): train only the i-th of n shares of each seed's populations (those of index i mod n
    among the seed's populations of every config, so the shares stay apart whenever each shard starts),
    kept in `.<name>.shard-<i>-of-<n>.runs.jsonl.gz`, and write no table (None): n processes or machines
    build a table together, and a build without a shard then reads every shard's runs, trains what is
    missing and writes the table. Every build reads the runs of every resume file of the table there."""
    import torch

    from autofl.data.datasets import load_raw_dataset
    from autofl.tuning.strategy.cohorts import group_configs

    configs = grid_configs(space)
    raw = load_raw_dataset(space.base_experiment().data)
    out_dir.mkdir(parents=True, exist_ok=True)
    index, shards = shard
    own = f".{name}.runs.jsonl.gz" if shards == 1 else f".{name}.shard-{index}-of-{shards}.runs.jsonl.gz"
    partial = out_dir / own
    # the resume file's first line says what its runs are of: a changed space file is never mixed in
    fingerprint = {"space": space.model_dump(mode="json", include={"base", "params", "method_base"}),
                   "configs": configs}
    header = json.dumps({"fingerprint": fingerprint}) + "\n"
    done: dict[tuple[int, int], dict[str, Any]] = {}
    mine: dict[tuple[int, int], dict[str, Any]] = {}  # the runs of this build's own file
    found = resume_files(out_dir, name)
    for path in found:
        lines = read_runs(path)
        try:
            known = bool(lines) and json.loads(lines[0]).get("fingerprint") == fingerprint
        except json.JSONDecodeError:
            known = False
        if not known:
            raise bad_input(f"{path}: the runs of an earlier build of another space or grid; delete the file "
                            f"to build {name} anew")
        for line in lines[1:]:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a build killed while it wrote: that line's run trains again
                continue
            done[(row["config"], row["seed"])] = row
            if path == partial:
                mine[(row["config"], row["seed"])] = row
    # written anew whole (what a kill cut short dropped; beside it, then renamed, so a kill now loses no run),
    # then appended to, a member per population
    fresh = partial.with_name(partial.name + ".tmp")
    with gzip.open(fresh, "wt", encoding="utf-8") as fh:
        fh.write(header + "".join(json.dumps(row) + "\n" for row in mine.values()))
    os.replace(fresh, partial)
    started = time.time()
    for seed in seeds:
        every = [{**config, "seed": seed} for config in configs]
        share = [c for g, group in enumerate(group_configs(space.base, space.method_base, every, width))
                 if g % shards == index for c in group]
        todo = [c for c in share if (c, seed) not in done]
        runs = [every[c] for c in todo]
        for group in group_configs(space.base, space.method_base, runs, width):
            t0 = time.perf_counter()
            rows = _train_group(space, [runs[i] for i in group], raw)
            seconds = (time.perf_counter() - t0) / len(group)  # a population's time, shared by its members
            lines = []
            for i, row in zip(group, rows):
                row = {"config": todo[i], "seed": seed, **row, "train_s": round(seconds, 3)}
                lines.append(json.dumps(row) + "\n")
                done[(todo[i], seed)] = row
            with gzip.open(partial, "at", encoding="utf-8") as fh:
                fh.write("".join(lines))
            print(f"{name}: seed {seed}, {sum(1 for c, s in done if s == seed)}/{len(configs)} configs "
                  f"({time.time() - started:.0f} s)", flush=True)
    if shards > 1:
        print(f"{name}: shard {index}/{shards} done; a build without --shard writes the table", flush=True)
        return None
    table = {
        "task": name,
        "built_with": {
            "command": command,
            "space": fingerprint["space"],
            "seeds": list(seeds), "population_width": width, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "train_s_total": round(sum(r["train_s"] for (_, seed), r in done.items() if seed in seeds), 1),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
        },
        "metric": {"val": VAL_KEY, "test": TEST_KEY},
        "max_rounds": space.max_rounds,
        "configs": configs,
        "seeds": list(seeds),
        # runs[config][seed index]: rounds, val, test, val_correct/test_correct[round][client], val_sizes,
        # test_sizes[client], diverged_at, clients_per_round
        "runs": [[{k: v for k, v in done[(ci, s)].items() if k not in ("config", "seed")} for s in seeds]
                 for ci in range(len(configs))],
    }
    path = out_dir / f"{name}.json.gz"
    fresh = out_dir / f".{name}.json.gz.tmp"  # written beside, then renamed: a reader never sees half a table
    with gzip.open(fresh, "wt", encoding="utf-8") as fh:
        json.dump(table, fh, separators=(",", ":"))
    os.replace(fresh, path)
    for resume in {partial, *found}:  # every run is in the table now
        resume.unlink(missing_ok=True)
    return path


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard I/N` as (I, N): the I-th (from 0) of N shares of a table's populations."""
    try:
        index, shards = (int(part) for part in text.split("/"))
    except ValueError:
        index, shards = -1, 0
    if not 0 <= index < shards:
        raise bad_input(f"--shard: {text!r}; allowed: I/N with 0 <= I < N (e.g. 0/2 and 1/2 for two processes)")
    return index, shards


def cmd_build(args: argparse.Namespace) -> None:
    import shutil

    import torch

    from autofl.errors import ConfigError
    from autofl.tuning.strategy.space import load_space

    # every refusal before any training or file is written
    if args.width < 1:
        raise bad_input(f"--width: {args.width} is no population width; allowed: 1 or more")
    if args.threads < 1:
        raise bad_input(f"--threads: {args.threads}; allowed: 1 or more")
    shard = parse_shard(args.shard) if args.shard else (0, 1)
    seeds = tuple(args.seeds) if args.seeds else TABLE_SEEDS
    if len(set(seeds)) != len(seeds) or len(seeds) < 2:
        raise bad_input(f"--seeds: {' '.join(map(str, seeds))}; allowed: two or more distinct seeds (the first is "
                        f"what a search sees, the others what re-evaluation runs)")
    if args.task and args.name:
        raise bad_input("--name: a shipped task keeps its name; allowed with --space only")
    if args.space:  # a user's task: its space file is copied beside the table, where replay reads both
        source = Path(args.space)
        name = args.name or source.stem
        out_dir = Path(args.out_dir) if args.out_dir else source.resolve().parent
        try:
            space = load_space(source)
        except (ConfigError, OSError) as err:
            raise bad_input(f"--space: {err}") from None
    else:
        name, out_dir, space = args.task, Path(args.out_dir) if args.out_dir else HERE, task_space(args.task)
    grid_configs(space)  # a grid of categorical params only
    if space.conditional:
        raise bad_input(f"conditional: {', '.join(space.conditional)}; a benchmark task's params are one grid, "
                        f"allowed: params only")
    if space.base_experiment().fl.eval_every != 1 or "fl.eval_every" in space.params:
        raise bad_input("base.fl.eval_every: a table holds every round's values (ASHA's rungs read them); allowed: 1")
    if args.space and source.resolve() != (out_dir / f"{name}.yaml").resolve():
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out_dir / f"{name}.yaml")
    torch.set_num_threads(args.threads)
    path = build_table(space, name, out_dir, seeds, args.width,
                       "python scripts/search_benchmark.py " + shlex.join(args.argv), shard)
    if path is not None:
        print(f"wrote {path}")


# ----------------------------------------------------------------------------------------- replay
OBJECTIVES = ("mean", "p10")  # what a config's value is: all clients' accuracy, or the worst-decile client's


def client_objective(correct: list[list[int]], sizes: list[int], objective: str) -> list[float]:
    """Per round, the value of `objective` over the clients' accuracies (clients with samples in that split)."""
    import numpy as np

    if objective == "mean":
        return [sum(c) / sum(sizes) for c in correct]
    held = np.array(sizes) > 0
    acc = np.array(correct, dtype=float)[:, held] / np.array(sizes, dtype=float)[held]
    return [float(v) for v in np.percentile(acc, 10, axis=1)]


NOISES = ("none", "half-clients", "quarter-samples", "both")  # validation noise a replay can add


class TableError(ValueError):
    """A table that cannot give what a replay asks of it (`replay` says so in one line, exit 2)."""


def noisy_counts(correct: list[list[int]], sizes: list[int], noise: str, clients: Any, rng: Any
                 ) -> tuple[list[list[int]], list[int]]:
    """A run's validation counts as a noisier evaluation would have seen them: only `clients` (a fixed
    half, with "half-clients" or "both"), and each client's accuracy on a quarter of its validation
    samples ("quarter-samples" or "both": drawn anew at each evaluation, hypergeometric from the
    client's correct count, since a table keeps counts, not which samples were right)."""
    import numpy as np

    counts, held = np.array(correct), np.array(sizes)
    if noise in ("half-clients", "both"):
        counts, held = counts[:, clients], held[clients]
    if noise in ("quarter-samples", "both"):
        quarter = np.maximum(held // 4, np.minimum(held, 1))
        counts = rng.hypergeometric(counts, held - counts, np.broadcast_to(quarter, counts.shape))
        held = quarter
    return counts.tolist(), held.tolist()


class Table:
    """A built table as arrays: val/test[config, seed, round-1] (NaN after a divergence) of the
    `objective` (`mean`: the stored mean accuracy; `p10`: the 10th percentile over clients, from the
    per-client counts a table built since 2026-11-28 holds); with `noise`, the validation values
    (what a search sees, never the test values it is judged by) as a noisier evaluation gives them
    (`noisy_counts`, drawn from `noise_seed`)."""

    def __init__(self, raw: dict[str, Any], objective: str = "mean", noise: str = "none", noise_seed: int = 0):
        import numpy as np

        self.task = raw["task"]
        self.configs: list[dict[str, Any]] = raw["configs"]
        self.keys = list(self.configs[0])
        self.max_rounds = int(raw["max_rounds"])
        self.seeds = list(raw.get("seeds", TABLE_SEEDS))
        self.objective, self.noise = objective, noise
        self._smoothed: dict[int, Any] = {}  # smoothed_val's arrays by k
        shape = (len(self.configs), len(self.seeds), self.max_rounds)
        self.val, self.test = np.full(shape, np.nan), np.full(shape, np.nan)
        self.diverged = np.zeros(shape[:2], dtype=bool)
        rng = np.random.default_rng(noise_seed)
        clients = None
        for c, per_seed in enumerate(raw["runs"]):
            for s, run in enumerate(per_seed):
                val, test = run["val"], run["test"]
                if (objective != "mean" or noise != "none") and not run.get("val_correct"):
                    option = "--objective " + objective if objective != "mean" else "--noise " + noise
                    raise TableError(f"{option}: table {self.task} holds no per-client values (rebuild it); "
                                     f"allowed here: --objective mean --noise none")
                if noise != "none":
                    if clients is None:  # the validation clients a noisy study evaluates: one half of those
                        held = np.flatnonzero(np.array(run["val_sizes"]) > 0)  # with validation samples, kept
                        clients = np.sort(rng.permutation(held)[: max(1, len(held) // 2)])
                    val = client_objective(*noisy_counts(run["val_correct"], run["val_sizes"], noise, clients, rng),
                                           objective)
                elif objective != "mean":
                    val = client_objective(run["val_correct"], run["val_sizes"], objective)
                if objective != "mean":
                    test = client_objective(run["test_correct"], run["test_sizes"], objective)
                n = len(val)
                self.val[c, s, :n], self.test[c, s, :n] = val, test
                self.diverged[c, s] = run["diverged_at"] is not None
        self.clients_per_round = int(raw["runs"][0][0]["clients_per_round"])
        self.index = {self.key(cfg): c for c, cfg in enumerate(self.configs)}
        # what a config is worth: its test value after the last round it trained, mean over the seeds
        last = np.where(np.isnan(self.test), -np.inf, np.arange(self.max_rounds)).argmax(axis=2)
        final_test = np.take_along_axis(self.test, last[..., None], axis=2)[..., 0]
        self.test_mean = final_test.mean(axis=1)
        self.best_test = float(self.test_mean.max())

    def key(self, params: dict[str, Any]) -> tuple:
        return tuple(params[k] for k in self.keys)

    @property
    def grid_rounds(self) -> int:
        """The grid's compute in rounds: every config once (one seed), all rounds."""
        return len(self.configs) * self.max_rounds

    def smoothed_val(self, k: int) -> Any:
        """The validation values as a search sees them when each round's value is the mean of the
        run's last `k` evaluated values (k = 1: `val` itself); a diverged run's missing rounds stay NaN.
        Computed once per k (a replay's search and each budget's re-evaluation read it)."""
        import numpy as np

        if k <= 1:
            return self.val
        if k in self._smoothed:
            return self._smoothed[k]
        import warnings

        out = np.full_like(self.val, np.nan)
        for r in range(self.max_rounds):
            window = self.val[:, :, max(0, r - k + 1): r + 1]
            with warnings.catch_warnings():  # a diverged run's all-NaN window: NaN, as it is set anyway
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(window, axis=2)
            out[:, :, r] = np.where(np.isnan(self.val[:, :, r]), np.nan, mean)
        self._smoothed[k] = out
        return out

    def regret(self, config: int) -> float:
        """Points of seed-mean test accuracy below the best config's (0: the best)."""
        return 100.0 * (self.best_test - float(self.test_mean[config]))


@dataclass(frozen=True)
class Method:
    """A search method: the space's sampler and scheduler sections, plus top-k re-evaluation."""

    name: str
    sampler: dict[str, Any]
    scheduler: dict[str, Any]
    reeval_top: int = 0  # 0: the best single-seed validation value; k: re-run the top k and the default
    continuous: bool = False  # the grid's numeric params of 3+ choices searched as log ranges (see `relaxed`)
    brief_rounds: int = 0  # > 0: no sampler or scheduler; every config for this many rounds, then the top k fully
    smooth: int = 1  # a round's value as the search sees it: the mean of the trial's last `smooth` evaluated values


def method_space(space, method: Method, seed: int):
    """The task's space with the method's sampler and scheduler, validated as a space file would be."""
    from autofl.tuning.strategy.space import SearchSpace

    tree = space.model_dump(mode="json", exclude_unset=True)
    tree.update(sampler=method.sampler, scheduler=method.scheduler, seed=seed, trials=1)
    if method.continuous:
        tree["params"] = {key: relaxed(spec) for key, spec in tree["params"].items()}
    return SearchSpace.model_validate(tree)


def numeric_choices(spec: dict[str, Any]) -> list[float] | None:
    """A categorical param's choices when they are 3 or more numbers (lr, mu), else None."""
    choices = spec.get("choices") or []
    numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)
    return sorted(choices) if spec.get("type") == "categorical" and numeric and len(choices) >= 3 else None


def relaxed(spec: dict[str, Any]) -> dict[str, Any]:
    """How a user would write the param without a grid: a log-scale float range over its choices (a
    choice of 0 stands for a tenth of the smallest positive one). The replay looks a proposal up at
    the nearest choice on that scale (`snapped`): a nearest-neighbour surrogate of the continuous
    space, in which a model-based sampler sees distinct values and never re-proposes a point."""
    choices = numeric_choices(spec)
    if choices is None:
        return spec
    return {"type": "float", "low": low_end(choices), "high": max(choices), "log": True}


def low_end(choices: list[float]) -> float:
    """The log range's low end: the smallest choice, or a tenth of the smallest positive one for 0."""
    positive = [c for c in choices if c > 0]
    return min(positive) / 10 if len(positive) < len(choices) else min(choices)


def snapped(space, params: dict[str, Any]) -> dict[str, Any]:
    """`params` proposed in a relaxed space, each numeric one moved to the grid's nearest choice on
    the log scale (0 at the range's low end)."""
    out = {}
    for key, value in params.items():
        choices = numeric_choices(space.params[key].model_dump(mode="json"))
        if choices is None:
            out[key] = value
            continue
        low = low_end(choices)
        out[key] = min(choices, key=lambda c: abs(math.log(max(c, low)) - math.log(value)))
    return out


@dataclass
class ReplayTrial:
    number: int
    config: int
    ot_trial: Any
    bracket: int
    rounds: int = 0
    judged: dict[float, float] | None = None


def replay_search(table: Table, space, method: Method, seed: int, workers: int, budget_rounds: int,
                  search_seed_index: int = 0) -> list[tuple[int, int, str, float]]:
    """One study on the table, as the live one runs it: Optuna's sampler (make_sampler) asks through
    the define-by-run space, the start point first; `workers` trials train at once, one round per
    step each; every round's value is reported to the Optuna trial and judged by the ASHA rule
    (autofl.tuning.strategy.asha) at its rungs; a trial that reaches max rounds is told COMPLETE, one stopped
    PRUNED, one that diverged FAIL. Runs until `budget_rounds` rounds were trained; returns
    (rounds spent when it ended, config, state, last value) per finished trial, in finishing order:
    any smaller budget's study is a prefix of it (a budget only cuts trials in flight).

    The search sees seed index `search_seed_index` of the table (autofl's searches train with the
    base seed, the table's seed 0)."""
    import numpy as np
    import optuna
    from optuna.trial import TrialState

    from autofl.tuning.strategy import asha
    from autofl.tuning.strategy.repeats import ask_unseen
    from autofl.tuning.strategy.space import DefineByRun
    from autofl.tuning.strategy.build import make_sampler, study_start_points

    mspace = method_space(space, method, seed)
    study = optuna.create_study(direction="maximize" if mspace.mode == "max" else "minimize", sampler=make_sampler(mspace))
    for point in study_start_points(mspace):
        study.enqueue_trial(point)
    define = DefineByRun(mspace)
    sched = mspace.scheduler
    max_t = table.max_rounds
    brackets = sched.brackets if sched.kind == "hyperband" else 1
    rungs = [asha.milestones(sched.grace_period * sched.reduction_factor ** b, max_t, sched.reduction_factor)
             for b in range(brackets)] if sched.kind in ("asha", "hyperband") else []
    recorded: list[dict[float, list[float]]] = [{m: [] for m in r} for r in rungs]
    bracket_rng = np.random.default_rng(seed)
    sizes = np.array([len(r) for r in rungs]) if rungs else np.array([1])
    bracket_p = np.exp(sizes - sizes.max()) / np.exp(sizes - sizes.max()).sum()  # Tune's bracket choice
    median_history: dict[int, list[float]] = {}

    def start(number: int) -> ReplayTrial:
        if mspace.sampler.skip_repeats:  # as the live ledger asks (autofl/tuning/strategy/repeats.py)
            ot, _ = ask_unseen(study, define, space_size=len(table.configs))
        else:
            ot = study.ask()
            define(ot)
        params = {k.split(":", 1)[-1]: v for k, v in ot.params.items()}
        config = table.index[table.key(snapped(space, params) if method.continuous else params)]
        bracket = int(bracket_rng.choice(len(bracket_p), p=bracket_p)) if len(bracket_p) > 1 else 0
        return ReplayTrial(number, config, ot, bracket, judged={})

    seen_val = table.smoothed_val(method.smooth)
    finished: list[tuple[int, int, str, float]] = []
    spent = 0
    running: list[ReplayTrial] = []
    count = 0
    while spent < budget_rounds:
        while len(running) < workers:
            running.append(start(count))
            count += 1
        for trial in list(running):
            if spent >= budget_rounds:
                break
            trial.rounds += 1
            spent += 1
            rnd = trial.rounds
            value = float(seen_val[trial.config, search_seed_index, rnd - 1])
            diverged = bool(np.isnan(table.val[trial.config, search_seed_index, rnd:]).all()) and \
                table.diverged[trial.config, search_seed_index] and rnd < max_t
            trial.ot_trial.report(value, rnd)
            stop = False
            if rnd < max_t and rungs:
                milestone = asha.rung_to_judge(rungs[trial.bracket], rnd, trial.judged)
                if milestone is not None:
                    values = recorded[trial.bracket][milestone]
                    stop = asha.decide(values, value, mspace.mode, sched.reduction_factor)
                    values.append(value)
                    trial.judged[milestone] = value
            elif rnd < max_t and sched.kind == "median":
                stop = median_stops(median_history, trial.number, rnd, value, sched.grace_period,
                                    sched.min_samples_required)
            if diverged:
                study.tell(trial.ot_trial, state=TrialState.FAIL)
                state = "FAIL"
            elif rnd >= max_t:
                study.tell(trial.ot_trial, value)
                state = "COMPLETE"
            elif stop:
                study.tell(trial.ot_trial, state=TrialState.PRUNED)
                state = "PRUNED"
            else:
                continue
            finished.append((spent, trial.config, state, value))
            running.remove(trial)
            if spent < budget_rounds:
                running.append(start(count))
                count += 1
    return finished


def median_stops(history: dict[int, list[float]], number: int, rnd: int, value: float, grace_period: int,
                 min_samples: int) -> bool:
    """Tune's MedianStoppingRule (max mode, hard stop): past the grace period a trial stops when its
    best value so far is below the median, over the other trials that reached this round, of their
    mean value up to it."""
    import numpy as np

    history.setdefault(number, []).append(value)
    if rnd < grace_period:
        return False
    others = [np.mean(v[:rnd]) for n, v in history.items() if n != number and len(v) >= rnd]
    if len(others) < min_samples:
        return False
    return max(history[number]) < float(np.median(others))


def choose(table: Table, space, finished: list[tuple[int, int, str, float]], budget_rounds: int,
           reeval_top: int, smooth: int = 1) -> int | None:
    """The config autofl would hand the user after `budget_rounds` rounds: the COMPLETE trial with
    the best validation value (ties: the first), or, re-evaluating, the best mean validation value
    on the table's other seeds among the top-k COMPLETE configs and the paper default (the rounds
    of those runs come out of the budget first). When no trial completed within the budget, the
    user keeps the paper default (the space's base config). With `smooth`, the re-evaluated runs are
    ranked by their smoothed last value too (what a study of a `_last3` objective re-evaluates by)."""
    import numpy as np

    from autofl.tuning.strategy.space import start_points

    default = [table.index[table.key(p)] for p in start_points(space)]
    reeval_cost = 0
    if reeval_top:
        reeval_cost = (reeval_top + len(default)) * (len(table.seeds) - 1) * table.max_rounds
    search_budget = budget_rounds - reeval_cost
    complete: list[tuple[float, int]] = []
    seen: set[int] = set()
    for spent, config, state, value in finished:
        if spent > search_budget:
            break
        if state == "COMPLETE" and config not in seen:
            seen.add(config)
            complete.append((value, config))
    if not complete:
        return default[0] if default else None
    ranked = [c for _, c in sorted(complete, key=lambda vc: -vc[0])]  # stable: ties keep finishing order
    if not reeval_top:
        return ranked[0]
    candidates = list(dict.fromkeys(default + ranked[:reeval_top]))
    fresh = table.smoothed_val(smooth)[candidates, 1:, table.max_rounds - 1].mean(axis=1)
    return candidates[int(np.nanargmax(fresh))]


# what autofl does by default: a space that names no sampler, scheduler or objective runs random search that
# skips repeats with ASHA on the 3-round mean of the validation value, and `best-config export` re-evaluates
# the top 3 and the paper default on 2 fresh seeds (the table's other two)
DEFAULT_METHOD = "random+asha(skip repeats,smooth3)+reeval3"
DEFAULT_SEARCH = "random+asha(skip repeats,smooth3)"  # its search alone (`live` runs it)
BUDGETS = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0)  # fractions of the grid's compute


def default_methods() -> list[Method]:
    """The samplers x schedulers the replay compares. cmaes cannot search the tables' categorical
    grids (refused by the space check); gp and TPE with skip_repeats are left out for their time
    (minutes per search at a few hundred trials; EXTRA_METHODS): `--methods gp+asha` adds one. Every
    method names skip_repeats, so a change of autofl's default changes no row."""
    asha = {"kind": "asha", "grace_period": 1, "reduction_factor": 2}
    methods = [
        Method("grid", {"kind": "grid", "skip_repeats": False}, {"kind": "none"}),
        Method("random", {"kind": "random", "skip_repeats": False}, {"kind": "none"}),
        Method("random+asha", {"kind": "random", "skip_repeats": False}, asha),
        Method("qmc+asha", {"kind": "qmc", "scramble": True, "skip_repeats": False}, asha),
        Method("tpe", {"kind": "tpe", "skip_repeats": False}, {"kind": "none"}),
        Method("tpe+asha", {"kind": "tpe", "skip_repeats": False}, asha),
        Method("tpe(startup10)+asha", {"kind": "tpe", "n_startup_trials": 10, "skip_repeats": False},
               asha),  # Optuna's 10
        Method("tpe(multivariate)+asha", {"kind": "tpe", "multivariate": True, "skip_repeats": False}, asha),
        Method("tpe+asha(g2,rf3)", {"kind": "tpe", "skip_repeats": False},
               {"kind": "asha", "grace_period": 2, "reduction_factor": 3}),
        Method("tpe+asha(g4,rf2)", {"kind": "tpe", "skip_repeats": False},
               {"kind": "asha", "grace_period": 4, "reduction_factor": 2}),
        Method("tpe+hyperband", {"kind": "tpe", "skip_repeats": False},
               {"kind": "hyperband", "grace_period": 1, "reduction_factor": 2, "brackets": 3}),
        Method("tpe+median", {"kind": "tpe", "skip_repeats": False}, {"kind": "median", "grace_period": 2}),
        Method("random+asha+reeval3", {"kind": "random", "skip_repeats": False}, asha, reeval_top=3),
        Method("tpe+asha+reeval3", {"kind": "tpe", "skip_repeats": False}, asha, reeval_top=3),
        # sampler.skip_repeats: a config already trained is told its outcome, not trained again
        Method("random+asha(skip repeats)", {"kind": "random", "skip_repeats": True}, asha),
        # a grid in random order (each config once), with ASHA
        Method("grid+asha", {"kind": "grid", "skip_repeats": False}, asha),
        # the numeric params of 3+ choices searched as log ranges, looked up at the nearest choice
        # (`relaxed`): how the samplers fare where nothing repeats
        Method("random+asha(continuous)", {"kind": "random", "skip_repeats": False}, asha, continuous=True),
        Method("tpe+asha(continuous)", {"kind": "tpe", "skip_repeats": False}, asha, continuous=True),
        Method("tpe(multivariate)+asha(continuous)", {"kind": "tpe", "multivariate": True, "skip_repeats": False},
               asha, continuous=True),
        # Egele et al. (2023): every config for one round, then as many of the best fully as the budget pays for
        Method("brief(1)+top-k", {}, {}, brief_rounds=1),
        # the default, every value it sees (ASHA's rungs, the final ranking) the mean of the trial's last 3
        # evaluated rounds: a candidate default under noisy validation (issue 39)
        Method("random+asha(skip repeats,smooth3)", {"kind": "random", "skip_repeats": True}, asha, smooth=3),
        # the default since 2026-12-02 (issue 39): the row above, then export's re-evaluation of the top 3
        Method("random+asha(skip repeats,smooth3)+reeval3", {"kind": "random", "skip_repeats": True}, asha,
               reeval_top=3, smooth=3),
    ]
    return methods


_ASHA = {"kind": "asha", "grace_period": 1, "reduction_factor": 2}
EXTRA_METHODS = [  # not in the default comparison: `--methods NAME ...` replays them
    Method("gp+asha", {"kind": "gp", "skip_repeats": False}, _ASHA),
    Method("tpe(startup5)+asha", {"kind": "tpe", "n_startup_trials": 5, "skip_repeats": False}, _ASHA),
    Method("tpe(no liar)+asha", {"kind": "tpe", "constant_liar": False, "skip_repeats": False}, _ASHA),
    # TPE refits over every told repeat: 2-3 minutes per search on a Fashion-MNIST table (replayed
    # on the digits tables only)
    Method("tpe+asha(skip repeats)", {"kind": "tpe", "skip_repeats": True}, _ASHA),
    Method("tpe+asha(skip repeats)+reeval3", {"kind": "tpe", "skip_repeats": True}, _ASHA, reeval_top=3),
    # every value the search sees (ASHA's rungs, the ranking) the mean of the trial's last 5 evaluated rounds
    Method("random+asha(skip repeats,smooth5)", {"kind": "random", "skip_repeats": True}, _ASHA, smooth=5),
    Method("random+asha(skip repeats)+reeval3", {"kind": "random", "skip_repeats": True}, _ASHA, reeval_top=3),
    # the default's search with another number of re-evaluated configs (the search is shared: nearly free to replay)
    Method("random+asha(skip repeats,smooth3)+reeval2", {"kind": "random", "skip_repeats": True}, _ASHA,
           reeval_top=2, smooth=3),
    Method("random+asha(skip repeats,smooth3)+reeval5", {"kind": "random", "skip_repeats": True}, _ASHA,
           reeval_top=5, smooth=3),
    Method("random+asha(skip repeats,smooth3)+reeval8", {"kind": "random", "skip_repeats": True}, _ASHA,
           reeval_top=8, smooth=3),
]


def brief_then_top_k(table: Table, brief_rounds: int, budget_rounds: int, seed: int) -> tuple[int | None, int, int]:
    """Egele et al. (2023)'s baseline: train every config for `brief_rounds` rounds (in an order drawn
    from `seed`: a budget too small for all trains the first ones), rank them by that round's
    validation value, fully train as many of the best as the rest of the budget pays for, and choose
    the best validation value after full training among those (with none fully trained: the best brief
    one). The search sees the table's first seed, as a live search does. Returns (config, configs
    trained briefly, configs trained fully)."""
    import numpy as np

    brief_rounds = min(brief_rounds, table.max_rounds)
    order = np.random.default_rng(seed).permutation(len(table.configs))
    brief = order[: min(len(order), budget_rounds // brief_rounds)]
    if not len(brief):
        return None, 0, 0
    at_brief = np.nan_to_num(table.val[brief, 0, brief_rounds - 1], nan=-np.inf)
    ranked = [int(c) for c in brief[np.argsort(-at_brief, kind="stable")]]
    left = budget_rounds - len(brief) * brief_rounds
    rest = table.max_rounds - brief_rounds  # rounds a brief config needs to be trained fully
    k = min(len(ranked), max(0, left // rest)) if rest > 0 else len(ranked)
    if k == 0:
        return ranked[0], len(brief), 0
    final_val = np.nan_to_num(table.val[:, 0, table.max_rounds - 1], nan=-np.inf)  # a diverged run: never chosen
    full = ranked[:k]
    return max(full, key=lambda c: (final_val[c], -full.index(c))), len(brief), k


def search_key(method: Method) -> tuple:
    """What a replayed search depends on: methods that differ only in how the winner is chosen
    (`reeval_top`) run the same search, which a replay of both runs once (`replay_methods`)."""
    return (json.dumps(method.sampler, sort_keys=True), json.dumps(method.scheduler, sort_keys=True),
            method.continuous, method.smooth, method.brief_rounds)


def replay_methods(table: Table, space, methods: list[Method], seed: int, workers: int) -> list[dict[str, Any]]:
    """Each of `methods` replayed once with search seed `seed` on `table`: per budget, the config it
    hands the user, its regret and the trials it ran by then. Methods whose searches are the same
    (`search_key`) share one."""
    searches: dict[tuple, list[tuple[int, int, str, float]]] = {}
    rows: list[dict[str, Any]] = []
    for method in methods:
        if method.brief_rounds:
            outcomes = [brief_then_top_k(table, method.brief_rounds, int(round(f * table.grid_rounds)), seed)
                        for f in BUDGETS]
        else:
            key = search_key(method)
            if key not in searches:
                searches[key] = replay_search(table, space, method, seed, workers, table.grid_rounds)
            finished = searches[key]
            outcomes = []
            for fraction in BUDGETS:
                rounds = int(round(fraction * table.grid_rounds))
                within = [state for spent, _, state, _ in finished if spent <= rounds]  # trials that ended by then
                outcomes.append((choose(table, space, finished, rounds, method.reeval_top, method.smooth),
                                 len(within), within.count("COMPLETE")))
        rows += [{"task": table.task, "method": method.name, "seed": seed, "budget": fraction,
                  "regret": None if chosen is None else round(table.regret(chosen), 4),
                  "config": chosen, "trials": trials, "complete": complete}
                 for fraction, (chosen, trials, complete) in zip(BUDGETS, outcomes)]
    return rows


def _replay_seed(job: tuple[str, tuple[Method, ...], int, int, str, str]) -> list[dict[str, Any]]:
    """A replay's unit of work: every method on one table with one search seed (the table, with this
    seed's validation noise, is read and built once for them all)."""
    import warnings

    import optuna

    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    task, methods, seed, workers, objective, noise = job
    table = Table(load_table(task), objective, noise, noise_seed=seed)
    return replay_methods(table, task_space(task), list(methods), seed, workers)


@contextmanager
def tables_from(folder: str | None) -> Iterator[None]:
    """`--tables DIR` as the folder `tables_dir()` reads while the block runs (a replay's workers inherit it)."""
    before = os.environ.get("AUTOFL_BENCH_TABLES")
    if folder:
        os.environ["AUTOFL_BENCH_TABLES"] = str(Path(folder).resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("AUTOFL_BENCH_TABLES", None)
        else:
            os.environ["AUTOFL_BENCH_TABLES"] = before


def selected_tasks(tasks: list[str] | None, tables: str | None) -> list[str]:
    """The tables `--task` names (default: every table in `--tables`, else the shipped small ones), each
    checked to exist in `tables_dir()`: a missing one is one line, exit 2."""
    if not tasks:
        tasks = tables_in(tables_dir()) if tables else list(TASKS)
        if not tasks:
            raise bad_input(f"--tables: no table (*.json.gz) in {tables_dir()}; build one with "
                            f"`build --space FILE --out-dir {tables}`")
    missing = [t for t in tasks if not table_path(t).is_file()]
    if missing:
        raise bad_input(f"--task: no table {missing[0]!r} in {tables_dir()}; allowed: {', '.join(tables_in(tables_dir()))}")
    return tasks


def cmd_replay(args: argparse.Namespace) -> None:
    methods = methods_of(args.methods)
    with tables_from(args.tables):
        _replay_tables(args, methods)


def methods_of(names: list[str] | None) -> list[Method]:
    """The replayed methods called `names` (all the default ones when None)."""
    known = {m.name: m for m in default_methods() + EXTRA_METHODS}
    unknown = [name for name in names or [] if name not in known]
    if unknown:
        raise bad_input(f"--methods: {unknown[0]!r} is not a method; allowed: {', '.join(known)}")
    return [known[name] for name in names] if names else default_methods()


def _replay_tables(args: argparse.Namespace, methods: list[Method]) -> None:
    from multiprocessing import get_context

    args.task = selected_tasks(args.task, args.tables)
    best_test = {}
    for task in args.task:  # every table checked here, before the workers (which could not say so) start
        try:
            best_test[task] = Table(load_table(task), args.objective, args.noise).best_test
        except TableError as err:
            raise bad_input(str(err)) from None
    jobs = [(task, tuple(methods), seed, args.workers, args.objective, args.noise) for task in args.task
            for seed in range(args.seeds)]
    started = time.time()
    rows: list[dict[str, Any]] = []
    # the workers import this script by its name (when it is imported rather than run, e.g. by a test)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
    pool = get_context("spawn").Pool(args.jobs) if args.jobs > 1 else None
    results = pool.imap_unordered(_replay_seed, jobs, chunksize=1) if pool else map(_replay_seed, jobs)
    searches = len(jobs) * len(methods)
    try:
        for i, result in enumerate(results):
            rows.extend(result)
            if (i + 1) % 10 == 0:
                print(f"replay: {(i + 1) * len(methods)}/{searches} searches ({time.time() - started:.0f} s)",
                      flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    out = Path(args.out) if args.out else (Path(args.tables) if args.tables else HERE) / "replay.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"command": "python scripts/search_benchmark.py " + shlex.join(args.argv),
               "objective": args.objective, "noise": args.noise, "seeds": args.seeds, "workers": args.workers,
               "budgets": list(BUDGETS),
               "methods": [vars(m) | {} for m in methods], "rows": rows,
               "best_test": best_test,
               "seconds": round(time.time() - started, 1)}
    if args.merge and out.exists():
        summary = merged(json.loads(out.read_text()), summary)  # summary holds plain values already (vars(m) | {})
    out.write_text(json.dumps(summary, default=lambda o: o.__dict__))
    print(f"replayed {searches} searches in {time.time() - started:.0f} s; wrote {out}")


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new`'s searches replace those of the same task and method in `old`, every other task's and
    method's rows kept (`replay --merge`): both replays must share seeds, trials in flight and
    budgets; a task's rows say which methods ran on it."""
    unset = {"objective": "mean", "noise": "none"}  # a replay from before these options
    for key in ("seeds", "workers", "budgets", "objective", "noise"):
        if old.get(key, unset.get(key)) != new.get(key, unset.get(key)):
            raise bad_input(f"--merge: the replay in the output file has other {key}; replay every task instead")
    replaced = {(r["task"], r["method"]) for r in new["rows"]}
    fresh = {m["name"] for m in new["methods"]}  # a method replayed again: its new definition
    return {**new, "command": f"{old['command']}; {new['command']}",
            "methods": [m for m in old["methods"] if m["name"] not in fresh] + new["methods"],
            "rows": [r for r in old["rows"] if (r["task"], r["method"]) not in replaced] + new["rows"],
            "best_test": {**old["best_test"], **new["best_test"]},
            "seconds": round(old["seconds"] + new["seconds"], 1)}


# ----------------------------------------------------------------------------------------- report
def summarize(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, float]]:
    """Per (task, method, budget): median, quartiles and mean of the regret over search seeds."""
    import numpy as np

    groups: dict[tuple[str, str, float], list[float]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["method"], row["budget"]), []).append(row["regret"])
    out = {}
    for key, values in groups.items():
        arr = np.array(values, dtype=float)
        q25, q50, q75 = np.percentile(arr, [25, 50, 75])
        out[key] = {"median": float(q50), "q25": float(q25), "q75": float(q75), "mean": float(arr.mean()),
                    "max": float(arr.max()), "min": float(arr.min()), "n": len(arr)}
    return out


def markdown_table(replay: dict[str, Any]) -> str:
    stats = summarize(replay["rows"])
    budgets = replay["budgets"]
    tasks = sorted({r["task"] for r in replay["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in replay["rows"]))
    lines = []
    for task in tasks:
        lines.append(f"**{task}** (best config: {100 * replay['best_test'][task]:.2f}% seed-mean test accuracy): "
                     f"regret in points, median [25th-75th percentile] over {replay['seeds']} search seeds")
        lines.append("")
        lines.append("| method | " + " | ".join(f"{int(round(100 * b))}%" for b in budgets) + " |")
        lines.append("|---|" + "---|" * len(budgets))
        for method in methods:
            cells = []
            for b in budgets:
                st = stats.get((task, method, b))
                cells.append("" if st is None else f"{st['median']:.2f} [{st['q25']:.2f}-{st['q75']:.2f}]")
            if any(cells):  # a method not replayed on this task has no row
                label = f"**{method}** (default)" if method == DEFAULT_METHOD else method
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def noise_table(replays: list[dict[str, Any]], budgets: tuple[float, ...] = (0.25, 1.0)) -> str:
    """How much each method degrades under validation noise: per task, the median regret over search
    seeds at `budgets` of each replay (the same tables, seeds and methods, `--noise` differing)."""
    stats = [summarize(r["rows"]) for r in replays]
    noises = [r.get("noise", "none") for r in replays]
    tasks = sorted({row["task"] for r in replays for row in r["rows"]})
    methods = list(dict.fromkeys(row["method"] for r in replays for row in r["rows"]))
    lines = []
    for task in tasks:
        lines.append(f"**{task}**: median regret (points) over {replays[0]['seeds']} search seeds, by validation noise "
                     f"and budget ({replays[0].get('objective', 'mean')} objective)")
        lines.append("")
        lines.append("| method | " + " | ".join(f"{n}, {int(round(100 * b))}%" for n in noises for b in budgets) + " |")
        lines.append("|---|" + "---|" * (len(noises) * len(budgets)))
        for method in methods:
            cells = [st.get((task, method, b)) for st in stats for b in budgets]
            if any(cells):
                label = f"**{method}** (default)" if method == DEFAULT_METHOD else method
                lines.append(f"| {label} | " + " | ".join("" if c is None else f"{c['median']:.2f}" for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def cmd_noise_report(args: argparse.Namespace) -> None:
    replays = [json.loads(Path(path).read_text()) for path in args.replays]
    for key in ("seeds", "workers", "budgets", "objective"):
        if len({json.dumps(r.get(key)) for r in replays}) > 1:
            raise bad_input(f"--replays: they differ in {key}; allowed: replays that differ in --noise only")
    table = noise_table(replays)
    out = Path(args.out)
    out.write_text(f"<!-- {'; '.join(r['command'] for r in replays)}; then python scripts/search_benchmark.py "
                   f"{shlex.join(args.argv)} -->\n\n{table}")
    print(table)
    print(f"wrote {out}")


TARGET_REGRET, TARGET_BUDGET = 0.5, 0.25  # issue 39's targets for the default
# issue 39's baselines, which every replay includes: a default is to be no worse than the best of them at every budget
BASELINES = ("grid", "random", "random+asha", "tpe+asha", "brief(1)+top-k")


def trials_table(replay: dict[str, Any], method: str = DEFAULT_METHOD) -> str:
    """How many trials `method` trained (ended within the budget; told repeats not counted) and how
    many of them ran every round, median over search seeds, per task and budget: what a space's
    `trials` should be for that share of a grid's compute."""
    import numpy as np

    budgets = replay["budgets"]
    rows = [r for r in replay["rows"] if r["method"] == method and "trials" in r]
    tasks = sorted({r["task"] for r in rows})
    if not rows:
        return ""
    lines = [f"Trials {method} trained by each budget (median over search seeds; in brackets: run to the "
             f"last round)", "", "| task | " + " | ".join(f"{int(round(100 * b))}%" for b in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for task in tasks:
        cells = []
        for b in budgets:
            sel = [r for r in rows if r["task"] == task and r["budget"] == b]
            cells.append(f"{np.median([r['trials'] for r in sel]):g} ({np.median([r['complete'] for r in sel]):g})")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def targets_table(replay: dict[str, Any]) -> str:
    """Per method and task, the issue's two targets for a default search: the smallest budget whose
    median regret is <= TARGET_REGRET (met when it is <= TARGET_BUDGET), and the budgets at which its
    median is above the best median of the BASELINES replayed (a baseline is held to the others), with
    the largest gap."""
    stats = summarize(replay["rows"])
    budgets = replay["budgets"]
    tasks = sorted({r["task"] for r in replay["rows"]})
    methods = list(dict.fromkeys(r["method"] for r in replay["rows"]))
    present = [b for b in BASELINES if b in methods]
    lines = [f"Targets: median regret <= {TARGET_REGRET} pt by {int(100 * TARGET_BUDGET)}% of the grid's compute; "
             f"at every budget no worse than the best of {', '.join(present) or 'no baseline'} (medians; the worst "
             "gap in points)", "",
             "| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for method in methods:
        cells = []
        for task in tasks:
            medians = {b: stats[(task, method, b)]["median"] for b in budgets if (task, method, b) in stats}
            if not medians:
                cells.append("")
                continue
            reach = next((b for b in budgets if medians.get(b, math.inf) <= TARGET_REGRET), None)
            first = "never" if reach is None else f"{int(round(100 * reach))}%"
            met = reach is not None and reach <= TARGET_BUDGET
            base = {}
            for b in budgets:
                others = [stats[(task, x, b)]["median"] for x in present if x != method and (task, x, b) in stats]
                if others:
                    base[b] = min(others)
            gaps = [medians[b] - base[b] for b in medians if b in base and medians[b] > base[b] + 1e-9]
            versus = "" if not base else ("never worse" if not gaps else f"worse at {len(gaps)} (by <= {max(gaps):.2f})")
            cells.append(f"{'met' if met else 'unmet'}: <= {TARGET_REGRET} from {first}; {versus}".rstrip("; "))
        label = f"**{method}** (default)" if method == DEFAULT_METHOD else method
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def objective_tables(replays: list[dict[str, Any]], budgets: tuple[float, ...] = (TARGET_BUDGET, 1.0)) -> str:
    """One table per objective over replays of the same tables: a row per method, a column per table and
    validation noise, each cell the median regret over search seeds at `budgets` ("a / b")."""
    lines = []
    for objective in dict.fromkeys(r.get("objective", "mean") for r in replays):
        mine = [r for r in replays if r.get("objective", "mean") == objective]
        stats = [summarize(r["rows"]) for r in mine]
        tasks = sorted({row["task"] for r in mine for row in r["rows"]})
        methods = list(dict.fromkeys(row["method"] for r in mine for row in r["rows"]))
        columns = [(task, i) for task in tasks for i in range(len(mine))]
        shown = " / ".join(f"{int(round(100 * b))}%" for b in budgets)
        lines += [f"**{objective} objective**: median regret (points) over {mine[0]['seeds']} search seeds at "
                  f"{shown} of the grid's compute, by table and validation noise", "",
                  "| method | " + " | ".join(f"{t}, noise {mine[i].get('noise', 'none')}" for t, i in columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for method in methods:
            cells = []
            for task, i in columns:
                values = [stats[i].get((task, method, b)) for b in budgets]
                cells.append("" if None in values else " / ".join(f"{v['median']:.2f}" for v in values))
            label = f"**{method}** (default)" if method == DEFAULT_METHOD else method
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def replay_label(replay: dict[str, Any]) -> str:
    """What a replay's searches saw: its objective and validation noise."""
    return f"{replay.get('objective', 'mean')} objective, noise {replay.get('noise', 'none')}"


def plot(replays: list[dict[str, Any]], path: Path) -> None:
    """Median regret (and its quartiles) against compute, one panel per task of each replay: with one
    replay two panels a row; with several, one row per replay (objective and noise) and one column per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(replay, summarize(replay["rows"]), task) for replay in replays
              for task in sorted({r["task"] for r in replay["rows"]})]
    cols = min(2, len(panels)) if len(replays) == 1 else max(len({r["task"] for r in x["rows"]}) for x in replays)
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    cmap = plt.get_cmap("tab20")
    for ax, (replay, stats, task) in zip(axes.flat, panels):
        methods = list(dict.fromkeys(r["method"] for r in replay["rows"]))
        for i, method in enumerate(methods):
            pts = [(b, stats[(task, method, b)]) for b in replay["budgets"] if (task, method, b) in stats]
            xs = [100 * b for b, _ in pts]
            default = method == DEFAULT_METHOD  # drawn black and thick
            ax.plot(xs, [st["median"] for _, st in pts], marker="o", ms=3, color="black" if default else cmap(i),
                    lw=2.6 if default else 1.2, zorder=3 if default else 2,
                    label=f"{method} (default)" if default else method)
            ax.fill_between(xs, [st["q25"] for _, st in pts], [st["q75"] for _, st in pts], color=cmap(i), alpha=0.12)
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.axvline(25, color="grey", lw=0.8, ls=":")
        ax.set_title(task if len(replays) == 1 else f"{task}: {replay_label(replay)}", fontsize=10)
        ax.set_xlabel("compute, % of the grid's (rounds x clients)")
        ax.set_ylabel("regret: points of test accuracy below the best config")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.0))  # at least 0-1 point: ticks 0 and 1 instead of one odd value
        ax.grid(alpha=0.3)
    axes.flat[cols - 1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cmd_report(args: argparse.Namespace) -> None:
    replays = [json.loads(Path(path).read_text()) for path in args.replay]
    parts = []
    for replay in replays:
        head = f"### {replay_label(replay).capitalize()}\n\n" if len(replays) > 1 else ""
        parts.append(head + markdown_table(replay) + "\n" + targets_table(replay) + "\n" + trials_table(replay))
    table = "\n".join(parts)
    if len(replays) > 1:  # the summary first: one table per objective
        table = objective_tables(replays) + "\n" + table
    md = Path(args.out_dir) / "report.md"
    png = Path(args.out_dir) / "report.png"
    commands = "; ".join(f"{r['command']} ({r['seconds']} s)" for r in replays)
    md.write_text(f"<!-- {commands}; then python scripts/search_benchmark.py {shlex.join(args.argv)} -->\n\n{table}")
    plot(replays, png)
    print(table)
    print(f"wrote {md} and {png}")


# ----------------------------------------------------------------------------------------- live
def live_regret(table: Table, best_params: dict[str, Any]) -> float:
    return table.regret(table.index[table.key({k.split(":", 1)[-1]: v for k, v in best_params.items()})])


def check_live_against_table(table: Table, trials: list[Any], smooth: int = 1) -> list[str]:
    """Differences between a live study's trials and the table: each trial's reported value at each
    round must be the table's seed-0 value of its config (smoothed over `smooth` rounds as the study's
    objective is: the replay's premise). [] when equal."""
    import math

    val = table.smoothed_val(smooth)
    problems = []
    for t in trials:
        config = table.index[table.key({k.split(":", 1)[-1]: v for k, v in t.params.items()})]
        for rnd, value in t.intermediate_values.items():
            expected = float(val[config, 0, int(rnd) - 1])
            if not math.isclose(value, expected, abs_tol=1e-4):
                problems.append(f"trial {t.number} round {rnd}: live {value:.5f}, table {expected:.5f}")
    return problems


def inside(regret: float, replayed: list[float]) -> bool:
    """Whether a live regret lies within the replay's range of regrets at that budget."""
    return min(replayed) - 1e-9 <= regret <= max(replayed) + 1e-9


def cmd_live(args: argparse.Namespace) -> int:
    """One real `autofl search` on the task's space at a budget, checked against the replay."""
    import subprocess
    import tempfile

    import optuna
    import yaml

    from autofl.engine.metric_keys import SMOOTHING_ROUNDS, smoothed_key
    from autofl.tuning.strategy.space import start_points

    table = Table(load_table(args.task))
    space = task_space(args.task)
    known = {m.name: m for m in default_methods() + EXTRA_METHODS}
    if args.method not in known:
        raise bad_input(f"--method: {args.method!r} is not a method; allowed: {', '.join(known)}")
    method = known[args.method]
    if method.continuous:
        raise bad_input(f"--method: {method.name} is replayed on a relaxed space; the live check runs the task's grid")
    if method.brief_rounds:
        raise bad_input(f"--method: {method.name} is no sampler and scheduler of autofl search; the live check runs one")
    if method.reeval_top:
        raise bad_input(f"--method: {method.name} re-evaluates as best-config export does; the live check runs the "
                        f"search alone (e.g. {DEFAULT_SEARCH})")
    if method.smooth not in (1, SMOOTHING_ROUNDS):
        raise bad_input(f"--method: {method.name} smooths over {method.smooth} rounds; autofl's objectives smooth "
                        f"over {SMOOTHING_ROUNDS} ({smoothed_key(VAL_KEY)}) or none")
    budget_rounds = int(round(args.budget * table.grid_rounds))
    with tempfile.TemporaryDirectory(prefix="autofl-live-") as tmp:
        tree = yaml.safe_load((HERE / f"{args.task}.yaml").read_text())
        tree.update(trials=10 * len(table.configs), budget_rounds=budget_rounds, seed=args.seed,
                    sampler=method.sampler, scheduler=method.scheduler, checkpoint_every_s=600,
                    objective=VAL_KEY if method.smooth == 1 else smoothed_key(VAL_KEY))
        path = Path(tmp) / "space.yaml"
        path.write_text(yaml.safe_dump(tree))
        proc = subprocess.run([sys.executable, "-m", "autofl.cli", "search", "--space", str(path), "--dir", tmp],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-3000:])
            log = Path(tmp) / space.study / "logs" / "driver.log"
            if log.exists():  # what Ray and Tune said: the live view keeps it off the terminal
                print("logs/driver.log ends:", log.read_text(errors="replace")[-3000:])
            return proc.returncode
        study = optuna.load_study(study_name=space.study, storage=f"sqlite:///{Path(tmp) / space.study / 'optuna.db'}")
        trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    best = max(complete, key=lambda t: t.value) if complete else None
    # no trial complete within the budget: the user keeps the paper default, as in the replay
    regret = live_regret(table, best.params if best else start_points(space)[0])
    mismatches = check_live_against_table(table, trials, method.smooth)
    replayed = []
    for s in range(args.seeds):
        rows = _replay_seed((args.task, (method,), s, args.workers, "mean", "none"))
        replayed += [r["regret"] for r in rows if r["budget"] == args.budget]
    rounds = sum(len(t.intermediate_values) for t in trials)
    print(f"live search on {args.task} at {100 * args.budget:.0f}% of the grid's compute ({budget_rounds} rounds; "
          f"{rounds} trained): {len(trials)} trials, {len(complete)} complete, regret {regret:.2f} points")
    print(f"replay of {method.name} at that budget over {args.seeds} seeds: regret min {min(replayed):.2f}, median "
          f"{sorted(replayed)[len(replayed) // 2]:.2f}, max {max(replayed):.2f}")
    for problem in mismatches[:5]:
        print("mismatch:", problem)
    ok = inside(regret, replayed) and not mismatches
    print("inside the replay's distribution" if ok else "NOT inside the replay's distribution")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------- describe
def describe_table(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """What a table offers a search benchmark, per objective it can give (mean; p10 where it holds
    per-client values): the best, median and worst config's seed-mean final test value (%), the spread
    between the best and the median (the issue's "several points"), and the regret (points) of the
    config that wins the first seed's last validation round, raw and smoothed over 3 rounds: what a
    search that trusts one seed's validation loses at best."""
    import numpy as np

    objectives = ["mean", "p10"] if raw["runs"][0][0].get("val_correct") else ["mean"]
    rows = []
    for objective in objectives:
        table = Table(raw, objective=objective)
        final = np.sort(table.test_mean)
        median = float(np.median(final))
        last = table.max_rounds - 1

        def winner(values: Any) -> float:
            at_last = np.nan_to_num(values[:, 0, last], nan=-np.inf)  # a run that diverged is never chosen
            return table.regret(int(np.argmax(at_last)))

        rows.append({
            "task": table.task, "objective": objective, "configs": len(table.configs), "seeds": len(table.seeds),
            "rounds": table.max_rounds, "best": 100 * final[-1], "median": 100 * median,
            "worst": 100 * final[0], "spread": 100 * (final[-1] - median),
            "seed0_winner_regret": winner(table.val), "seed0_smooth3_winner_regret": winner(table.smoothed_val(3)),
            "diverged_runs": int(table.diverged.sum()),
        })
    return rows


def cmd_describe(args: argparse.Namespace) -> None:
    with tables_from(args.tables):
        names = selected_tasks(args.task, args.tables)
        raws = [load_table(name) for name in names]
    print("| table | objective | configs x seeds x rounds | best | median | worst | best - median | "
          "seed-0 winner's regret (smoothed 3) | diverged runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for raw in raws:
        for row in describe_table(raw):
            print(f"| {row['task']} | {row['objective']} | {row['configs']} x {row['seeds']} x {row['rounds']} | "
                  f"{row['best']:.2f} | {row['median']:.2f} | {row['worst']:.2f} | {row['spread']:.2f} | "
                  f"{row['seed0_winner_regret']:.2f} ({row['seed0_smooth3_winner_regret']:.2f}) | "
                  f"{row['diverged_runs']} |")


# ----------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="train every grid config of a task on the table's seeds")
    which = build.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", choices=TASKS, help="a shipped task (its space file under scripts/search_benchmark/)")
    which.add_argument("--space", help="your own space file (every param a categorical grid): the table and a "
                       "copy of the file go to --out-dir, where `replay --tables DIR --task NAME` reads them")
    build.add_argument("--name", help="the table's task name (default: the space file's stem)")
    build.add_argument("--out-dir", help="where the table is written (default: beside the space file; for --task, "
                       "the shipped tables' folder)")
    build.add_argument("--seeds", type=int, nargs="+", help=f"training seeds (default: {' '.join(map(str, TABLE_SEEDS))}: "
                       "the search's, then `export --reeval`'s)")
    build.add_argument("--width", type=int, default=16, help="configs of one seed trained together as a population "
                       "(autofl.population; those sharing every non-fusible value; 1: one at a time)")
    build.add_argument("--threads", type=int, default=1, help="torch threads")
    build.add_argument("--shard", help="I/N: train the I-th of N shares of the populations (N processes or "
                       "machines on one folder); a build without --shard then writes the table")
    replay = sub.add_parser("replay", help="replay every search method against the shipped tables")
    replay.add_argument("--task", nargs="+",
                        help=f"tables to replay (default: every table in --tables, else the shipped {' '.join(TASKS)})")
    replay.add_argument("--tables", help="the folder of the tables and their space files (default: the shipped ones)")
    replay.add_argument("--objective", choices=OBJECTIVES, default="mean",
                        help="a config's value: mean accuracy, or the 10th percentile over clients (tables with per-client values)")
    replay.add_argument("--noise", choices=NOISES, default="none",
                        help="validation noise the searches see (tables with per-client values): half the validation "
                        "clients, a quarter of each client's validation samples, or both")
    replay.add_argument("--seeds", type=int, default=30, help="search seeds per method")
    replay.add_argument("--workers", type=int, default=2, help="trials in flight at once (a 2-CPU machine's study)")
    replay.add_argument("--jobs", type=int, default=2, help="processes")
    replay.add_argument("--methods", nargs="*", help="only these methods (names as in the table)")
    replay.add_argument("--out", help="the replay file (default: replay.json in --tables, else the shipped tables' folder)")
    replay.add_argument("--merge", action="store_true",
                        help="keep the searches already in --out of other tasks or methods (same seeds, budgets, workers)")
    report = sub.add_parser("report", help="markdown table and PNG from a replay")
    report.add_argument("--replay", nargs="+", default=[str(HERE / "replay.json")],
                        help="replay files (several: of the same tables, one per objective and noise; one figure "
                        "row and one set of tables each)")
    report.add_argument("--out-dir", default=str(HERE))
    noise = sub.add_parser("noise-report", help="how much each method degrades under validation noise (markdown)")
    noise.add_argument("--replays", nargs="+", required=True, help="replay files of the same tables and methods, "
                       "each with its --noise (none first)")
    noise.add_argument("--out", default=str(HERE / "noise.md"))
    describe = sub.add_parser("describe", help="each table's spread and what one seed's validation winner loses "
                              "(markdown)")
    describe.add_argument("--tables", help="the folder of the tables (default: the shipped ones)")
    describe.add_argument("--task", nargs="+", help="tables to describe (default: every table in the folder)")
    live = sub.add_parser("live", help="one real autofl search on a task, checked against the replay")
    live.add_argument("--task", choices=TASKS, required=True)
    live.add_argument("--budget", type=float, default=0.25, choices=BUDGETS)
    live.add_argument("--method", default=DEFAULT_SEARCH, help="the replayed method the live search runs "
                      "(the task file's sampler and scheduler)")
    live.add_argument("--seed", type=int, default=0, help="the live study's sampler seed")
    live.add_argument("--seeds", type=int, default=30)
    live.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the tables and replays record as their command
    commands = {"build": cmd_build, "replay": cmd_replay, "report": cmd_report, "noise-report": cmd_noise_report,
                "live": cmd_live, "describe": cmd_describe}
    result = commands[args.command](args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

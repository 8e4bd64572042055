"""Re-evaluation: run a study's best configs and its paper default over fresh seeds, in parallel
as Ray Tune trials, and say whether the winner's gain over the default survives seed noise.

A candidate is a set of searched values: the N best COMPLETE trials by objective, plus the paper
default (the space's base config, which is also the study's first trial). Each candidate runs
once per fresh seed (seed `space seed + 1000 + k`, k = 0..K-1: new initial weights, client
sampling and batch order); the partition and split stay the study's own unless `vary_partition`
redraws them with the same seed.

Every finished run is one JSON file under `<study>/reeval/runs/`, written by the driver as Tune
reports the trial complete: a killed driver loses only the runs in flight, and a second call runs
only what is missing. The summary (per candidate: mean, std and a Student-t 95% confidence
interval of the objective and of every test metric, and the paired difference to the default) is
written to `<study>/reeval/summary.json` and to the Optuna study's user attr `reeval`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autofl.errors import AutoFLError
from autofl.files import write_atomic
from autofl.tuning.store.study import StudyFolder, no_feasible_row, resolved_config, rows_of
from autofl.tuning.strategy.constraints import is_feasible, violated
from autofl.tuning.strategy.objectives import REPORTED_KEYS, TEST_METRICS, best, best_first, gain
from autofl.tuning.strategy.space import start_points

REEVAL_DIR = "reeval"
# what a round ships and computes, on the report card beside the test metrics
CARD_COST_KEYS = ("upload_bytes_per_round", "download_bytes_per_round", "flops_per_round")
SEED_OFFSET = 1000  # fresh seeds start here, above any seed a study is likely to have searched with
DEFAULT_LABEL = "default"


class ReevalInterrupted(AutoFLError):
    """Ctrl-C during re-evaluation: the finished runs are saved; the same command again runs the rest."""

    exit_code = 130


@dataclass(frozen=True)
class Candidate:
    label: str  # "default" or "trial-<number>"
    trial: int | None  # the study trial it comes from (None: the paper default from the base config)
    params: dict[str, Any]  # searched values (Optuna names), set on the space's base config
    search_value: float | None  # its single-seed objective in the search


@dataclass(frozen=True)
class Run:
    candidate: Candidate
    seed: int
    vary_partition: bool

    @property
    def key(self) -> str:
        return f"{self.candidate.label}-seed{self.seed}" + ("-newpartition" if self.vary_partition else "")

    def values(self, data_seed: int) -> dict[str, Any]:
        """The trial config: the candidate's values plus this run's seed (and the study's partition seed)."""
        values = {**self.candidate.params, "seed": self.seed}
        if not self.vary_partition:
            values["data.seed"] = data_seed
        return values


def fresh_seeds(study: StudyFolder, count: int) -> list[int]:
    base = study.space().base_experiment().seed
    return [base + SEED_OFFSET + k for k in range(count)]


def candidates(study: StudyFolder, top: int) -> list[Candidate]:
    """The paper default first, then the `top` best COMPLETE trials (a trial whose values equal the
    default's, such as the study's enqueued first trial, is the default itself and not repeated)."""
    ot = study.load_optuna()
    space = study.space()
    if space.multi_objective:
        raise AutoFLError(
            f"re-evaluation: study {study.name!r} is multi-objective ({', '.join(space.metrics)}); "
            f"re-evaluation ranks configs on one objective: see its Pareto front with "
            f"autofl best-config export {study.name} --pareto"
        )

    trials = ot.get_trials(deepcopy=False) if ot is not None else []
    complete = [
        t
        for t in trials
        if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value) and is_feasible(t)
    ]
    if not complete:
        no_feasible_row(study, rows_of(ot) if ot is not None else [])  # an infeasible trial is never a candidate
        raise AutoFLError(f"study {study.name!r} has no completed trial to re-evaluate; see autofl status {study.name}")
    complete = best_first(complete, key=lambda t: t.value, mode=space.mode)
    # the paper default; in a cross-method study, that of the best trial's method
    method = complete[0].params.get("method.name")
    default_params = {} if method is None else {"method.name": method}
    default_point = next((p for p in start_points(space) if p.get("method.name") == method), {})
    default_trial = next((t for t in complete if default_point and t.params == default_point), None)
    chosen = [
        Candidate(
            DEFAULT_LABEL,
            default_trial.number if default_trial else None,
            default_params,
            default_trial.value if default_trial else None,
        )
    ]
    for t in complete:
        if len(chosen) > top:
            break
        if t is not default_trial:
            chosen.append(Candidate(f"trial-{t.number}", t.number, dict(t.params), t.value))
    return chosen


def runs_dir(study: StudyFolder) -> Path:
    return study.root / REEVAL_DIR / "runs"


def load_finished(study: StudyFolder) -> dict[str, dict[str, Any]]:
    """Finished runs by key (a file that is not valid JSON, e.g. cut by a kill, is run again)."""
    out = {}
    for path in sorted(runs_dir(study).glob("*.json")) if runs_dir(study).is_dir() else []:
        try:
            out[path.stem] = json.loads(path.read_text())
        except ValueError:
            continue
    return out


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1))


def plan(study: StudyFolder, seeds: int, top: int, vary_partition: bool) -> tuple[list[Candidate], list[Run]]:
    chosen = candidates(study, top)
    fresh = fresh_seeds(study, seeds)
    runs = [Run(c, s, vary_partition) for c in chosen for s in fresh]
    return chosen, runs


def record_run(study: StudyFolder, run: Run, result: dict[str, Any]) -> None:
    _write_json(
        runs_dir(study) / f"{run.key}.json",
        {
            "candidate": run.candidate.label,
            "trial": run.candidate.trial,
            "params": run.candidate.params,
            "seed": run.seed,
            "vary_partition": run.vary_partition,
            "metrics": {k: result[k] for k in REPORTED_KEYS if result.get(k) is not None},
            "diverged": result.get("diverged"),
        },
    )


def t_interval(values: list[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean, sample std (ddof 1) and the Student-t confidence interval of the mean."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def summarize(study: StudyFolder, chosen: list[Candidate], runs: list[Run]) -> dict[str, Any]:
    """Per candidate: statistics of the objective and test metrics over its finished seeds, and the
    paired (same seed) difference of the objective and of personal_test_acc to the default."""
    space = study.space()
    finished = load_finished(study)
    by_label: dict[str, dict[int, dict[str, float]]] = {c.label: {} for c in chosen}
    for run in runs:
        record = finished.get(run.key)
        if record is not None:
            by_label[run.candidate.label][run.seed] = record["metrics"]
    default = by_label[DEFAULT_LABEL]
    rows = []
    for c in chosen:
        per_seed = by_label[c.label]
        row: dict[str, Any] = {
            "candidate": c.label,
            "trial": c.trial,
            "params": c.params,
            "search_value": c.search_value,
            "seeds": sorted(per_seed),
            "config": resolved_config(space, c.params),  # what `best-config export` writes, read without torch
        }
        for metric in (space.objective, *TEST_METRICS, *CARD_COST_KEYS):
            values = [m[metric] for m in per_seed.values() if metric in m]
            if values:
                row[metric] = t_interval(values)
        if space.constraints and per_seed:
            row["violated"] = mean_violations(space.parsed_constraints, list(per_seed.values()))
        if c.label != DEFAULT_LABEL:
            for metric in (space.objective, "personal_test_acc"):
                common = [s for s in per_seed if s in default and metric in per_seed[s] and metric in default[s]]
                if common:
                    row[f"diff_{metric}"] = t_interval([per_seed[s][metric] - default[s][metric] for s in common])
        rows.append(row)
    # a candidate whose seeds' mean misses a constraint is never the best (the default included)
    complete = [r for r in rows if space.objective in r and not r.get("violated")]
    top = best(complete, key=lambda r: r[space.objective]["mean"], mode=space.mode)
    return {
        "objective": space.objective,
        "mode": space.mode,
        "seeds": sorted({r.seed for r in runs}),
        "vary_partition": any(r.vary_partition for r in runs),
        "rows": rows,
        "best": top["candidate"] if top else None,
        "verdict": verdict(top, space.objective, space.mode)
        if top is not None or not any(r.get("violated") for r in rows)
        else "every re-evaluated candidate misses a constraint on its mean over seeds: no config to pick",
    }


def mean_violations(constraints: list[Any], per_seed: list[dict[str, float]]) -> list[str]:
    """The constraints that the mean over seeds of their metrics misses (a metric no seed
    reported counts as missed)."""
    means = {}
    for c in constraints:
        values = [m[c.metric] for m in per_seed if isinstance(m.get(c.metric), (int, float))]
        if values:
            means[c.metric] = sum(values) / len(values)
    return violated(constraints, means)


def verdict(best: dict[str, Any] | None, objective: str, mode: str) -> str:
    """One plain sentence: is the best candidate's gain over the paper default real?"""
    if best is None:
        return "no candidate has finished a re-evaluation run yet"
    if best["candidate"] == DEFAULT_LABEL:
        return f"the paper default has the best mean {objective}: no searched config beats it over these seeds"
    diff = best.get(f"diff_{objective}")
    if diff is None or diff["n"] < 2:
        return (
            f"{best['candidate']} has the best mean {objective}, but too few paired seeds to test it against "
            f"the default"
        )
    better_by, low, high = gain(diff, mode)
    span = f"{better_by:+.4f}, 95% CI [{low:+.4f}, {high:+.4f}] over {diff['n']} paired seeds"
    if low > 0:
        return f"significant: {best['candidate']} beats the paper default on {objective} by {span}"
    return (
        f"not significant: {best['candidate']} vs the paper default on {objective} is {span}; the CI "
        f"includes 0, so the gain is within seed noise"
    )


def save_summary(study: StudyFolder, summary: dict[str, Any]) -> None:
    _write_json(study.root / REEVAL_DIR / "summary.json", summary)
    ot = study.load_optuna()
    if ot is not None:
        ot.set_user_attr("reeval", json.loads(json.dumps(summary)))  # plain JSON (NaN stays a float)


def load_summary(study: StudyFolder) -> dict[str, Any] | None:
    path = study.root / REEVAL_DIR / "summary.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def reevaluate(
    study: StudyFolder,
    seeds: int,
    top: int,
    vary_partition: bool,
    address: str | None,
    on_done: Callable[[Run, dict], None] = lambda run, result: None,
    on_plan: Callable[[int, int], None] = lambda missing, total: None,
) -> dict[str, Any]:
    """Run what is missing of (default + `top` best) x `seeds` fresh seeds; summarize and store."""
    chosen, runs = plan(study, seeds, top, vary_partition)
    done = load_finished(study)
    missing = [r for r in runs if r.key not in done]
    on_plan(len(missing), len(runs))
    if missing:
        from autofl.tuning.tune.run_list import run_configs  # lazy: pulls ray and torch

        data_seed = study.space().base_experiment().data_seed()

        def recorded(index: int, result: dict[str, Any]) -> None:
            record_run(study, missing[index], result)
            on_done(missing[index], result)

        try:
            errored = [
                missing[i].key
                for i in run_configs(study, [r.values(data_seed) for r in missing], address, recorded, name="reeval")
            ]
        except KeyboardInterrupt:  # no summary from the runs that happened to finish
            saved = len(set(load_finished(study)) & {r.key for r in runs})
            raise ReevalInterrupted(
                f"re-evaluation interrupted; {saved} of {len(runs)} runs are saved: run the "
                f"same command again to finish"
            ) from None
    else:
        errored = []
    summary = summarize(study, chosen, runs)
    save_summary(study, summary)
    if errored:
        raise AutoFLError(
            f"re-evaluation: {len(errored)} run(s) failed ({', '.join(errored[:3])}); the others are "
            f"saved: run the same command again to retry the failed ones"
        )
    return summary

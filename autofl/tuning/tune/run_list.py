"""Run a fixed list of trial configs as one Ray Tune experiment: a grid over the list's indices
with the study's resources, no searcher and no scheduler; with `resources.population`, the configs
that differ only in fusible values (one seed's candidates) train as one population per trial. The caller hears of each finished run
as Tune reports it (re-evaluation writes its record then); this module knows nothing of who calls it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.tune import Callback

from autofl.tuning.store.study import REFERENCE_DIR, StudyFolder, recorded_width
from autofl.tuning.strategy.cohorts import group_configs
from autofl.tuning.tune import interrupt
from autofl.tuning.tune.cohort_trainable import RunListCohortTrainable
from autofl.tuning.tune.experiment import study_trainable
from autofl.tuning.tune.ray_start import init_ray
from autofl.tuning.tune.trainable import RunListTrainable


class _Recorder(Callback):
    """Hands each finished run's last result to `on_done`; collects the indices of runs that errored."""

    def __init__(self, on_done: Callable[[int, dict], None], cohorts: list[list[int]]):
        self.on_done = on_done
        self.cohorts = cohorts
        self.errored: list[int] = []

    def __getstate__(self) -> dict:  # Tune pickles its callbacks into tuner.pkl; this one holds the
        return {}  # caller's function and is never restored (a killed caller re-plans its list)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if "cohort" not in trial.config:
            self.on_done(trial.config["run"], trial.last_result)
            return
        for entry in (trial.last_result or {}).get("finals", []):  # each run of the cohort, as it ended
            self.on_done(int(entry["run"]), entry)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if "cohort" in trial.config:
            self.errored.extend(self.cohorts[trial.config["cohort"]])
        else:
            self.errored.append(trial.config["run"])


def reeval_width(study: StudyFolder) -> int:
    """How many runs one trial trains together: the space's `resources.population`, or the width its
    `auto` chose at the study's first run (1 if it never measured one); 1 where the runs compare with
    harm references (eval.harmed_clients: a population has none)."""
    space = study.space()
    if space.base_experiment().eval.harmed_clients:
        return 1
    population = space.resources.population
    return population if isinstance(population, int) else recorded_width(study) or 1


def run_configs(
    study: StudyFolder,
    configs: list[dict[str, Any]],
    address: str | None,
    on_done: Callable[[int, dict], None],
    name: str = "runs",
) -> list[int]:
    """Train every config of `configs` (trial values on the study's space) once, in parallel with
    the study's resources; `on_done(index, last_result)` as each completes. Returns the indices
    of the runs that errored (not handed to `on_done`). A Ctrl-C (Tune ends its loop gracefully and
    returns as if done) raises KeyboardInterrupt once Tune has returned."""
    space = study.space()
    init_ray(address)
    cohorts = group_configs(space.base, space.method_base, configs, reeval_width(study))
    if all(len(c) == 1 for c in cohorts):  # one run per trial
        trainable = study_trainable(
            space,
            RunListTrainable,
            runs=configs,
            checkpoint_every_s=math.inf,
            reference_dir=str(study.root / REFERENCE_DIR),
        )  # a run is re-run, not restored, after a kill
        grid = {"run": tune.grid_search(list(range(len(configs))))}
    else:  # the runs of a cohort (one seed's candidates) train as one population
        trainable = study_trainable(
            space,
            RunListCohortTrainable,
            runs=configs,
            cohorts=cohorts,
            checkpoint_every_s=math.inf,
            objective=space.objective,
            mode=space.mode,
        )
        grid = {"cohort": tune.grid_search(list(range(len(cohorts))))}
    recorder = _Recorder(on_done, cohorts)
    tuner = tune.Tuner(
        trainable,
        param_space=grid,
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=study.tune_root(),
            verbose=0,
            callbacks=[recorder, interrupt.InterruptWatch()],
            failure_config=tune.FailureConfig(max_failures=0),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False),
        ),
    )
    with interrupt.watching():  # puts the SIGINT handler back: Tune leaves its own when no signal came
        tuner.fit()
    if interrupt.received():
        raise KeyboardInterrupt
    return recorder.errored

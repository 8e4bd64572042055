"""Runs a re-evaluation's (config, seed) list as one Ray Tune experiment: a grid over the list's
indices with the study's resources, no searcher and no scheduler. The driver writes each run's
record as Tune reports the run complete."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from ray import tune
from ray.tune import Callback

from autofl.search.reeval import Run, record_run
from autofl.search.runner import init_ray, study_trainable
from autofl.search.study import Study
from autofl.search.trainable import RunListTrainable


class _Recorder(Callback):
    """Writes each run's record as Tune reports it complete; collects the keys of runs that errored."""

    def __init__(self, study: Study, runs: list[Run], on_done: Callable[[Run, dict], None]):
        self.study, self.runs, self.on_done = study, runs, on_done
        self.errored: list[str] = []

    def __getstate__(self) -> dict:  # Tune pickles its callbacks into tuner.pkl; this one holds the
        return {}  # driver's printer and is never restored (a killed re-evaluation re-plans from its files)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run = self.runs[trial.config["run"]]
        record_run(self.study, run, trial.last_result)
        self.on_done(run, trial.last_result)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.errored.append(self.runs[trial.config["run"]].key)


def execute(study: Study, runs: list[Run], address: str | None, on_done: Callable[[Run, dict], None]) -> list[str]:
    """Run `runs` in parallel with the study's resources, recording each as it completes. Returns
    the keys of runs that errored (not recorded, so a later call retries them)."""
    space = study.space()
    init_ray(address)
    data_seed = space.base_experiment().data_seed()
    trainable = study_trainable(space, RunListTrainable, runs=[r.values(data_seed) for r in runs],
                                checkpoint_every_s=math.inf)  # a run is re-run, not restored, after a kill
    recorder = _Recorder(study, runs, on_done)
    tuner = tune.Tuner(
        trainable,
        param_space={"run": tune.grid_search(list(range(len(runs))))},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"reeval-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=study.tune_root(), verbose=0,
            callbacks=[recorder], failure_config=tune.FailureConfig(max_failures=0),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False)),
    )
    tuner.fit()
    return recorder.errored

"""Run a fixed list of trial configs as one Ray Tune experiment: a grid over the list's indices
with the study's resources, no searcher and no scheduler. The caller hears of each finished run
as Tune reports it (re-evaluation writes its record then); this module knows nothing of who calls it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.tune import Callback

from autofl.tuning.store.study import REFERENCE_DIR, StudyFolder
from autofl.tuning.tune import interrupt
from autofl.tuning.tune.experiment import study_trainable
from autofl.tuning.tune.ray_start import init_ray
from autofl.tuning.tune.trainable import RunListTrainable


class _Recorder(Callback):
    """Hands each finished run's last result to `on_done`; collects the indices of runs that errored."""

    def __init__(self, on_done: Callable[[int, dict], None]):
        self.on_done = on_done
        self.errored: list[int] = []

    def __getstate__(self) -> dict:  # Tune pickles its callbacks into tuner.pkl; this one holds the
        return {}  # caller's function and is never restored (a killed caller re-plans its list)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.on_done(trial.config["run"], trial.last_result)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.errored.append(trial.config["run"])


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
    trainable = study_trainable(
        space,
        RunListTrainable,
        runs=configs,
        checkpoint_every_s=math.inf,
        reference_dir=str(study.root / REFERENCE_DIR),
    )  # a run is re-run, not restored, after a kill
    recorder = _Recorder(on_done)
    tuner = tune.Tuner(
        trainable,
        param_space={"run": tune.grid_search(list(range(len(configs))))},
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

"""ASHA whose rung records start from the study, so that a resumed (or extended) study prunes as
an uninterrupted one would.

Tune does not save a scheduler's state with the experiment: after a kill and `--resume`, a fresh
ASHA has empty rungs, and a trial that the clean run would have stopped at its first rung (its
value below the rung's cutoff) runs to the end. Before it places its first trial, this scheduler
records every finished or running trial's value at each rung milestone from the Optuna study (the
per-round values the searcher reports), keyed by the Tune trial id it ran under. A trial already
recorded at a rung is not judged there again, exactly as in one uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.tune.schedulers import AsyncHyperBandScheduler

from autofl.search.study import Study


class StudyASHA(AsyncHyperBandScheduler):
    def __init__(self, study_root: Path, **kwargs: Any):
        super().__init__(**kwargs)
        self._study_root = str(study_root)  # the storage URL is read from the study, never pickled
        self._seeded = False

    def __getstate__(self) -> dict[str, Any]:  # a restored driver rebuilds the rungs from the study
        return {**self.__dict__, "_seeded": False}

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self.seed_from_study()
        super().on_trial_add(tune_controller, trial)

    def seed_from_study(self) -> int:
        """Record the study's trials in the rungs (once per driver); returns how many values."""
        if self._seeded:
            return 0
        self._seeded = True
        ot = Study(Path(self._study_root)).load_optuna()
        if ot is None:
            return 0
        added = 0
        for t in ot.get_trials(deepcopy=False):
            trial_id = t.user_attrs.get("tune_trial_id")
            if trial_id is None or t.user_attrs.get("interrupted"):
                continue
            for bracket in self._brackets:
                for milestone, recorded in bracket._rungs:
                    value = t.intermediate_values.get(int(milestone)) if milestone == int(milestone) else None
                    if value is not None and trial_id not in recorded:
                        recorded[trial_id] = self._metric_op * value
                        added += 1
        return added

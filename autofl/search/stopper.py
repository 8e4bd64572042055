"""Stop a resumed trial that the study already recorded as finished.

Optuna's storage is written at every trial event, Tune's experiment snapshot only every few
seconds. A driver killed between the two leaves a trial that Optuna has finished but that Tune's
snapshot still lists as running; on resume Tune would train it again from its last checkpoint.
This stopper looks each trial up once per driver (at its first result) and stops it if its Optuna
trial is already finished, so no trial is trained or recorded twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import optuna
from optuna.trial import FrozenTrial
from ray.tune import Stopper

from autofl.search.searcher import finished_in_run
from autofl.search.study import Study


class AlreadyRecordedStopper(Stopper):
    def __init__(self, study_root: Path, run_name: str):
        self._study_root = str(study_root)  # the storage URL is read from the study, never pickled
        self._run_name = run_name  # only this Tune experiment's trials (the searcher tags them)
        self._looked_up: set[str] = set()
        self._study: optuna.Study | None = None  # opened once per driver, never pickled

    def __getstate__(self) -> dict[str, Any]:  # a restored driver looks every trial up again
        return {**self.__dict__, "_looked_up": set(), "_study": None}

    def __call__(self, trial_id: str, result: dict) -> bool:
        if trial_id in self._looked_up:
            return False
        self._looked_up.add(trial_id)
        if self._study is None:
            self._study = Study(Path(self._study_root)).load_optuna()
        return trial_id in finished_in_run(self._study.get_trials(deepcopy=False), self._run_name)

    def stop_all(self) -> bool:
        return False


def rounds_used(trials: Iterable[FrozenTrial]) -> dict[str, int]:
    """Rounds each trial reached (its last reported round), keyed by Tune trial id."""
    return {str(t.user_attrs.get("tune_trial_id", f"#{t.number}")): max(t.intermediate_values, default=0)
            for t in trials}


class RoundBudgetStopper(Stopper):
    """Stop the study once its trials together trained `budget_rounds` FL rounds (every run of the
    study counts: the rounds already in the storage are read at the first result)."""

    def __init__(self, study_root: Path, budget_rounds: int):
        self._study_root = str(study_root)
        self._budget = budget_rounds
        self._rounds: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:  # a restored driver reads the storage again
        return {**self.__dict__, "_rounds": None}

    def __call__(self, trial_id: str, result: dict) -> bool:
        if self._rounds is None:
            study = Study(Path(self._study_root)).load_optuna()
            self._rounds = rounds_used(study.get_trials(deepcopy=False))
        self._rounds[trial_id] = max(self._rounds.get(trial_id, 0), int(result.get("round", 0)))
        return False

    def stop_all(self) -> bool:
        return self._rounds is not None and sum(self._rounds.values()) >= self._budget

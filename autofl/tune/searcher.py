"""Tune's OptunaSearch, with the per-round bookkeeping a study needs.

Stock OptunaSearch reports intermediate values by training iteration and records an ASHA-stopped
trial as COMPLETE with its early-round score. Here intermediate values are keyed by FL round, a
trial stopped before `max_t` rounds is recorded as PRUNED, and each Optuna trial carries the Tune
trial id, the round of its value and its (reported, never optimized) test metrics.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

REPORTED_KEYS = ("round", "personal_val_acc", "personal_test_acc", "personal_test_acc_std",
                 "personal_test_acc_p10", "global_val_acc", "global_test_acc", "train_loss")


def finished_in_run(trials: Iterable[FrozenTrial], run_name: str) -> set[str]:
    """Tune trial ids of the Optuna trials that `run_name` suggested and the study has finished."""
    return {t.user_attrs.get("tune_trial_id") for t in trials
            if t.state.is_finished() and t.user_attrs.get("tune_run") == run_name}


class RoundAwareOptunaSearch(OptunaSearch):
    def __init__(self, *args: Any, max_t: int, run_name: str, budget: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._max_t = max_t
        self._run_name = run_name
        self._budget = budget

    def _budget_used(self) -> int:
        """Trials this searcher suggested, plus the run's trials finished by a driver that died
        before Tune saved them (still RUNNING ones are orphans to replace, not counted)."""
        finished = finished_in_run(self._ot_study.get_trials(deepcopy=False), self._run_name)
        return len(self._ot_trials) + len(finished - set(self._ot_trials))

    def suggest(self, trial_id: str) -> dict | str | None:
        if self._ot_study is not None and self._budget_used() >= self._budget:
            return Searcher.FINISHED
        params = super().suggest(trial_id)
        if params is not None:
            self._ot_trials[trial_id].set_user_attr("tune_trial_id", trial_id)
            self._ot_trials[trial_id].set_user_attr("tune_run", self._run_name)
        return params

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        value = result.get(self.metric)
        if trial_id in self._completed_trials or value is None or not math.isfinite(value):
            return
        try:
            self._ot_trials[trial_id].report(float(value), int(result["round"]))
        except UpdateFinishedTrialError:  # finished before an interrupted driver could save its state
            self._completed_trials.add(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        self._completed_trials.add(trial_id)
        ot_trial = self._ot_trials[trial_id]
        stored = self._ot_study._storage.get_trial(ot_trial._trial_id)
        if stored.state.is_finished():  # recorded before an interrupted driver could save its state
            return
        value = (result or {}).get(self.metric)
        rnd = int((result or {}).get("round", 0))
        fresh = rnd and rnd not in stored.intermediate_values  # Tune may hand the last result only here
        if value is not None and math.isfinite(value) and fresh:
            ot_trial.report(float(value), rnd)
        for key in REPORTED_KEYS:
            if result and result.get(key) is not None:
                ot_trial.set_user_attr(key, result[key])
        if error or value is None or not math.isfinite(value):
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
        elif rnd < self._max_t:
            self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
        else:
            self._ot_study.tell(ot_trial, float(value), state=TrialState.COMPLETE)

"""Tune stoppers that read the study ledger (they never change a trial's state).

AlreadyRecordedStopper: Optuna's storage is written at every trial event, Tune's experiment
snapshot only every few seconds. A driver killed between the two leaves a trial that the study
has finished but that Tune's snapshot still lists as running; on resume Tune would train it again
from its last checkpoint. This stopper looks each trial up once per driver (at its first result)
and stops it if the ledger already finished it, so no trial is trained or recorded twice.

RoundBudgetStopper: stops the study once its trials together trained `budget_rounds` FL rounds.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Stopper

from autofl.tuning.store.ledger import Ledger
from autofl.tuning.strategy.cohorts import member_results


class AlreadyRecordedStopper(Stopper):
    def __init__(self, ledger: Ledger, run_name: str):
        self._ledger = ledger  # pickles as the study folder: the storage is reopened
        self._run_name = run_name  # only this Tune experiment's trials (the searcher tags them)
        self._looked_up: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:  # a restored driver looks every trial up again
        return {**self.__dict__, "_looked_up": set()}

    def __call__(self, trial_id: str, result: dict) -> bool:
        if trial_id in self._looked_up:
            return False
        self._looked_up.add(trial_id)
        return trial_id in self._ledger.finished_in_run(self._run_name)

    def stop_all(self) -> bool:
        return False


class RoundBudgetStopper(Stopper):
    """Stop the study once its trials together trained `budget_rounds` FL rounds (every run of the
    study counts: the rounds already in the ledger are read at the first result)."""

    def __init__(self, ledger: Ledger, budget_rounds: int):
        self._ledger = ledger
        self._budget = budget_rounds
        self._rounds: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:  # a restored driver reads the ledger again
        return {**self.__dict__, "_rounds": None}

    def __call__(self, trial_id: str, result: dict) -> bool:
        if self._rounds is None:
            self._rounds = self._ledger.rounds_used()
        for key, entry in member_results(trial_id, result):  # a population trial: each member's rounds
            self._rounds[key] = max(self._rounds.get(key, 0), int(entry.get("round") or 0))
        return False

    def stop_all(self) -> bool:
        return self._rounds is not None and sum(self._rounds.values()) >= self._budget

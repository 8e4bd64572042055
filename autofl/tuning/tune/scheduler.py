"""ASHA on Tune's public scheduler hooks, its rungs rebuilt from the study ledger, so that a
resumed (or extended) study prunes as an uninterrupted one would.

Tune does not save a scheduler's state with the experiment: after a kill and `--resume`, a fresh
scheduler would have empty rungs, and a trial that the clean run would have stopped at its first
rung runs to the end. Before it judges its first trial, this scheduler takes the rungs from the
ledger (every tagged trial's per-round values replayed through the same rule), keyed by Tune
trial id; a trial already recorded at a rung is not judged there again, exactly as in one
uninterrupted run. The rule itself is autofl/tuning/strategy/asha.py (one bracket, as Tune's default).

A population trial (autofl/tuning/strategy/cohorts.py) reports its members' values in one result;
each member is judged as a trial of its own, keyed by its member id (the ledger's tag), and a member
stopped at a rung is closed PRUNED through the ledger there and then (its cohort goes on without it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from autofl.tuning.store.ledger import Ledger
from autofl.tuning.strategy import asha
from autofl.tuning.tune.searcher import noting_failed_writes


class StudyASHA(FIFOScheduler):
    """ASHA (one bracket) or asynchronous Hyperband (`brackets` > 1: bracket s starts its rungs at
    grace_period * reduction_factor**s, and a trial's bracket is drawn from its id)."""

    def __init__(
        self,
        ledger: Ledger,
        max_t: int,
        grace_period: float = 1,
        reduction_factor: float = 2,
        time_attr: str = "round",
        metric: str | None = None,
        mode: str | None = None,
        brackets: int = 1,
    ):
        super().__init__()
        self._ledger = ledger
        self._time_attr, self._max_t, self._rf = time_attr, max_t, reduction_factor
        self._milestones = [asha.milestones(grace_period, max_t, reduction_factor, s) for s in range(brackets)]
        self._weights = asha.bracket_weights(grace_period, max_t, reduction_factor, brackets)
        self._metric, self._mode = metric, mode
        self._rung_history: list[dict[float, dict[str, float]]] | None = None  # per bracket, from the ledger

    def __getstate__(self) -> dict[str, Any]:  # a restored driver rebuilds the rungs from the study
        return {**self.__dict__, "_rung_history": None, "_numbers": {}, "_seen": set(), "_pruned": set()}

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if (self._metric and metric) or (self._mode and mode):
            return False
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return True

    @property
    def brackets(self) -> int:
        return len(self._milestones)

    def bracket_of(self, trial_id: str) -> int:
        """The bracket of Tune trial `trial_id`: drawn from its Optuna trial number where the study
        knows it (a trial trained again after a kill keeps its number and so its bracket; Tune's
        ids are random per run), else from the id."""
        if len(self._milestones) == 1:
            return 0
        numbers = self.__dict__.setdefault("_numbers", {})
        if trial_id not in numbers:
            numbers[trial_id] = self._ledger.number_of(trial_id)
        number = numbers[trial_id]
        return self._bracket_of_number(number) if number is not None else asha.bracket_of(trial_id, self._weights)

    def _bracket_of_number(self, number: int) -> int:
        return asha.bracket_of(f"trial-{number}", self._weights)

    @property
    def rungs_per_bracket(self) -> list[dict[float, dict[str, float]]]:
        """Per bracket: milestone -> {Tune trial id: value at that rung} (objective units)."""
        self.seed_from_study()
        assert self._rung_history is not None  # seeded above
        return self._rung_history

    @property
    def rungs(self) -> dict[float, dict[str, float]]:
        """The first bracket's rungs (ASHA's only one)."""
        return self.rungs_per_bracket[0]

    def _member_of(self, bracket: int) -> Callable[[str], bool]:
        return lambda trial_id: self.bracket_of(trial_id) == bracket

    def _number_in_bracket(self, bracket: int, trial: Any) -> bool:
        return self._bracket_of_number(trial.number) == bracket

    def seed_from_study(self) -> int:
        """Take the rungs from the ledger (once per driver); returns how many values they held."""
        if self._rung_history is not None:
            return 0
        self._rung_history = [
            self._ledger.rung_history(
                rungs,
                self._max_t,
                None if len(self._milestones) == 1 else functools.partial(self._number_in_bracket, s),
            )
            for s, rungs in enumerate(self._milestones)
        ]
        return sum(len(recorded) for bracket in self._rung_history for recorded in bracket.values())

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if not self._metric or self._mode not in ("max", "min"):
            raise ValueError("StudyASHA needs a metric and a mode (max or min): pass them to tune.TuneConfig")
        self.seed_from_study()
        members = (trial.config or {}).get("members")
        for key in [str(m["id"]) for m in members] if isinstance(members, list) else [trial.trial_id]:
            self._take_over_earlier_ids(key)

    def _take_over_earlier_ids(self, trial_id: str) -> None:
        """A trial a killed driver left, trained again under the new Tune id `trial_id` (the ledger
        adopted it): the rung values its earlier attempt recorded are its own, under its new id, so
        it is judged neither against itself nor again at a rung it passed."""
        number = self._ledger.number_of(trial_id)
        if number is None or self._rung_history is None:
            return
        earlier = next(
            (t.user_attrs.get("earlier_tune_trial_ids") or [] for t in self._ledger.trials() if t.number == number), []
        )
        for bracket in self._rung_history:
            for recorded in bracket.values():
                for old in earlier:
                    if old in recorded:
                        recorded[trial_id] = recorded.pop(old)

    def _record(self, trial_id: str, reached: float, value: float) -> str:
        """Judge and record a result at its rung (autofl.tuning.strategy.asha's rule)."""
        bracket = self.bracket_of(trial_id)
        rungs = self.rungs_per_bracket[bracket]
        judged = [m for m, recorded in rungs.items() if trial_id in recorded]
        milestone = asha.rung_to_judge(self._milestones[bracket], reached, judged)
        if milestone is None:
            return TrialScheduler.CONTINUE
        others = list(rungs[milestone].values())
        assert self._mode is not None  # checked in on_trial_add
        rungs[milestone][trial_id] = value
        return TrialScheduler.STOP if asha.decide(others, value, self._mode, self._rf) else TrialScheduler.CONTINUE

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        if not isinstance(result.get("members"), list):
            return self._judge(trial.trial_id, result)
        return self._judge_members(result)

    def _judge(self, trial_id: str, result: dict) -> str:
        seen = self.__dict__.setdefault("_seen", set())
        if trial_id not in seen:  # its first result in this driver
            seen.add(trial_id)
            if self._stopped_before(trial_id):
                return TrialScheduler.STOP
        if result[self._time_attr] >= self._max_t:
            return TrialScheduler.STOP  # finished; recorded when Tune reports it complete
        return self._record(trial_id, result[self._time_attr], result[self._metric])

    def _judge_members(self, result: dict) -> str:
        """A population trial's result (autofl/tuning/strategy/cohorts.py): each member judged at its
        rung as a trial of its own, against every member and trial of the rung. A member ASHA stops
        is closed PRUNED at once, with this round's value (the ledger's rule: it stopped before
        max_t), so its cohort's worker drops it before its next round; the cohort trial stops when
        none of its members goes on."""
        pruned = self.__dict__.setdefault("_pruned", set())
        seen = self.__dict__.setdefault("_seen", set())
        going_on = False
        for member in result["members"]:
            key = str(member["id"])
            if key not in seen and key not in pruned:  # its first result in this driver: finished before?
                self._take_over_earlier_ids(key)  # a member that joined a refilled cohort after its driver's kill
                trial = self._ledger.trial_of(key)
                if trial is not None and trial.state.is_finished():
                    pruned.add(key)  # closed by an earlier driver; a worker that could not tell trains it on
            if key in pruned or member.get("diverged") or self._metric not in member:
                continue
            entry = {self._time_attr: result[self._time_attr], **member}
            if self._judge(key, entry) == TrialScheduler.CONTINUE:
                going_on = True
            elif entry[self._time_attr] < self._max_t:
                pruned.add(key)
                with noting_failed_writes():  # a failed write ends the driver in one line, as the searcher's
                    if "training_iteration" in result:  # when it left its cohort (a refilled one counts by it)
                        self._ledger.note_left(int(member["number"]), int(result["training_iteration"]))
                    self._ledger.close(int(member["number"]), entry, False, [str(self._metric)], self._max_t)
        return TrialScheduler.CONTINUE if going_on else TrialScheduler.STOP

    def _stopped_before(self, trial_id: str) -> bool:
        """Whether an earlier driver's ASHA stopped this trial at its last rung, and was killed before
        the trial ended (CI, 2026-11-27: a kill just after a decision): its value at that rung is in the
        study, so it is not judged there again, and without this it ran on. The decision is the rung's
        rule on the value against the rung's other values (the others it was judged against, when trials
        run one at a time). Only the last rung a trial was judged at is unsettled: a trial that reported
        a later round passed it."""
        trial = self._ledger.trial_of(trial_id)  # one read of the study
        if trial is None or not trial.intermediate_values:
            return False
        bracket = self.bracket_of(trial_id)
        milestones = self._milestones[bracket]
        judged: list[float] = []
        last_judged: tuple[int, float] | None = None
        for rnd in sorted(trial.intermediate_values):  # the rung each of its results was judged at
            milestone = asha.rung_to_judge(milestones, rnd, judged) if rnd < self._max_t else None
            if milestone is not None:
                judged.append(milestone)
                last_judged = (rnd, milestone)
        if last_judged is None or last_judged[0] != max(trial.intermediate_values):
            return False  # never judged, or it reported a round after its last rung: it passed
        recorded = self.rungs_per_bracket[bracket].get(last_judged[1], {})
        if trial_id not in recorded:
            return False
        others = [v for other, v in recorded.items() if other != trial_id]
        assert self._mode is not None  # checked in on_trial_add
        return asha.decide(others, recorded[trial_id], self._mode, self._rf)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        if self._time_attr not in result or self._metric not in result:
            return
        if not isinstance(result.get("members"), list):
            self._record(trial.trial_id, result[self._time_attr], result[self._metric])
            return
        pruned = self.__dict__.setdefault("_pruned", set())
        for member in result["members"]:  # each member's last value at its rung (a pruned one's is there)
            if str(member["id"]) not in pruned and not member.get("diverged") and self._metric in member:
                reached = member.get(self._time_attr, result[self._time_attr])  # members may be at other rounds
                self._record(str(member["id"]), reached, member[self._metric])

    def debug_string(self) -> str:
        return "StudyASHA: " + "; ".join(
            " | ".join(f"round {m:g}: {len(r)} trials" for m, r in bracket.items())
            for bracket in (self._rung_history or [])
        )

"""The study's Tune searcher, on Tune's public `Searcher` interface: Optuna proposes through the
ledger's ask (any Optuna sampler: TPE, random, CMA-ES, ...), and every trial event goes to the
ledger, which alone decides the trial's state (autofl/tuning/store/ledger.py).

Per-round values are recorded by FL round (not training iteration), a trial stopped before
`max_t` rounds is PRUNED, and each trial carries its Tune trial id and run. The searcher's own
state (Tune id -> Optuna number, the trials it finished) is saved as JSON in Tune's experiment
folder; everything else lives in the Optuna storage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from autofl.files import write_atomic
from autofl.tuning.store import write_failure
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.store.study import resolved_config
from autofl.tuning.strategy.cohorts import fixed_params, member_id, member_results, refills
from autofl.tuning.strategy.objectives import direction


@contextmanager
def noting_failed_writes() -> Iterator[None]:
    """Tune logs what a searcher raises and goes on: a failed write (disk full, read-only) is noted
    first, so that the driver ends with it in one line (autofl/tuning/store/write_failure.py)."""
    try:
        yield
    except Exception as err:
        write_failure.note(err)
        raise


class StudySearcher(Searcher):
    CKPT_FILE_TMPL = "searcher-state-{}.json"

    def __init__(
        self,
        ledger: Ledger,
        define: Callable[[Any], dict[str, Any] | None],
        sampler: Any,
        metric: str | list[str],
        mode: str | list[str],
        max_t: int,
        run_name: str,
        budget: int,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        skip_repeats: bool = False,
        population: int = 1,
        base: dict[str, Any] | None = None,
        refill: bool = False,
        method_base: dict[str, dict[str, Any]] | None = None,
    ):
        # Ray's Searcher keeps lists (several objectives) as they are; its annotation says str
        super().__init__(metric=metric, mode=mode)  # type: ignore[arg-type]
        self._skip_repeats = skip_repeats  # sampler.skip_repeats: autofl/tuning/strategy/repeats.py
        self._ledger = ledger
        self._define = define  # Optuna define-by-run: suggests the trial's params
        self._sampler = sampler
        self._metrics = list(metric) if isinstance(metric, list) else [metric]
        self._max_t = max_t
        self._run_name = run_name
        self._budget = budget
        self._trials: dict[str, int] = {}  # Tune trial id (a cohort's: member id) -> Optuna trial number
        self._finished: set[str] = set()  # those ids this searcher saw finish
        # population trials (autofl/tuning/strategy/cohorts.py): configs per Tune trial, at most
        self._population = population
        self._base = base or {}  # the space's base config (which method a trial runs)
        self._cohorts: dict[str, list[str]] = {}  # a cohort's Tune trial id -> its member ids
        self._tune_done: set[str] = set()  # cohorts' Tune trial ids that Tune completed
        # refilled cohorts (the scheduler prunes members: autofl/tuning/strategy/cohorts.py): the fixed
        # params of each cohort the searcher refills as its members leave
        self._refill = refill
        self._method_base = method_base or {}
        self._refilled: dict[str, dict[str, Any]] = {}
        self._max_concurrent = 0  # no limit until Tune sets one

        modes = list(mode) if isinstance(mode, list) else [mode]
        ledger.study(sampler=sampler, create_directions=[direction(m) for m in modes])
        if points_to_evaluate:
            ledger.enqueue(points_to_evaluate)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune's `max_concurrent_trials`, applied here: Tune's ConcurrencyLimiter would forget its
        live trials on restore and then drop the resumed trials' results."""
        self._max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str) -> dict | str | None:  # type: ignore[override]  # Searcher.FINISHED is a str
        with noting_failed_writes():
            return self._suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        with noting_failed_writes():
            self._on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with noting_failed_writes():
            self._on_trial_complete(trial_id, result, error)

    def _live(self) -> int:
        """Tune trials handed out and not finished (a cohort counts once)."""
        cohorts = getattr(self, "_cohorts", {})
        members = {m for ids in cohorts.values() for m in ids}
        solo = set(self._trials) - members - self._finished
        return len(solo) + len(set(cohorts) - getattr(self, "_tune_done", set()))

    def _suggest(self, trial_id: str) -> dict | str | None:
        if self._max_concurrent and self._live() >= self._max_concurrent:
            return None  # asked again when a trial completes
        if getattr(self, "_population", 1) > 1:
            return self._suggest_cohort(trial_id)
        skip_repeats = getattr(self, "_skip_repeats", False)  # a searcher pickled before the option: off
        asked = self._ledger.ask(
            self._run_name,
            trial_id,
            set(self._trials),
            self._budget,
            self._sampler,
            self._define,
            skip_repeats=skip_repeats,
        )
        if asked is None:
            return Searcher.FINISHED
        number, params = asked
        self._take(trial_id, number, params)
        return params

    def _take(self, trial_id: str, number: int, params: dict[str, Any]) -> None:
        self._trials[trial_id] = number
        space = getattr(self._define, "space", None)
        if space is not None:  # `best-config export` reads it back without torch or the registries
            self._ledger.record_config(number, resolved_config(space, params))

    def _suggest_cohort(self, trial_id: str) -> dict | str | None:
        """A population trial: up to `population` configs that differ only in fusible values, each
        its own Optuna trial (autofl/tuning/strategy/cohorts.py). Its config lists the members."""
        first = member_id(trial_id, 0)
        asked = self._ledger.ask(
            self._run_name,
            first,
            set(self._trials),
            self._budget,
            self._sampler,
            self._define,
            skip_repeats=self._skip_repeats,
        )
        if asked is None:
            return Searcher.FINISHED
        members: list[dict[str, Any]] = [{"id": first, "number": asked[0], "params": asked[1]}]
        self._take(first, *asked)
        fixed = fixed_params(asked[1], self._base)  # None: its method trains configs one by one
        while fixed is not None and len(members) < self._population:
            mid = member_id(trial_id, len(members))
            more = self._ask_member(mid, fixed)
            if more is None:
                break
            members.append({"id": mid, "number": more[0], "params": more[1]})
        self._cohorts[trial_id] = [str(m["id"]) for m in members]
        if getattr(self, "_refill", False) and fixed is not None and refills(asked[1], self._base, self._method_base):
            self._refilled[trial_id] = fixed
            return {"members": members, "refill": True, "width": self._population}
        return {"members": members}

    def _ask_member(self, mid: str, fixed: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """A cohort's further member `mid` with the cohort's `fixed` params (`Ledger.ask_member`), taken as
        this searcher's trial; None where the ledger gives none."""
        more = self._ledger.ask_member(
            self._run_name,
            mid,
            set(self._trials),
            self._budget,
            self._sampler,
            self._define,
            fixed,
            skip_repeats=self._skip_repeats,
        )
        if more is not None:
            self._take(mid, *more)
        return more

    def _refill_cohort(self, trial_id: str, iteration: int) -> None:
        """A new member for each of cohort `trial_id`'s members that left (pruned, finished, failed), up to
        the cohort's width and as long as the budget allows: asked as the cohort's other members are (the
        cohort's fixed params), tagged with the next member id, and assigned to join after the cohort's
        training iteration `iteration` (the result this answers), so that a cohort resumed from an earlier
        checkpoint adds it at the same point of its training."""
        members = self._cohorts[trial_id]
        # counted as of `iteration` from the study: a driver resumed from an older snapshot, whose cohort trains
        # earlier iterations again, asks at the iterations the first driver asked at, never sooner
        live, index = self._ledger.cohort_state(trial_id, iteration)
        fixed = self._refilled[trial_id]
        while live < self._population:
            mid = member_id(trial_id, index)  # never a member id the cohort has used (the study holds them all)
            more = self._ask_member(mid, fixed)
            if more is None:
                return
            members.append(mid)
            self._ledger.assign_member(more[0], more[1], iteration)
            live, index = live + 1, index + 1

    def _on_trial_result(self, trial_id: str, result: dict) -> None:
        cohort = getattr(self, "_cohorts", {}).get(trial_id)
        refilled = trial_id in getattr(self, "_refilled", {})
        iteration = int(result.get("training_iteration", 0))
        for key, entry in member_results(trial_id, result):
            if entry.get("diverged") and key in self._trials and key not in self._finished:
                self._finished.add(key)  # a member that diverged: FAIL now, its cohort goes on
                if refilled:  # (written while the trial is open: Optuna changes no finished trial)
                    self._ledger.note_left(self._trials[key], iteration)
                self._ledger.close(self._trials[key], entry, False, self._metrics, self._max_t)
                continue
            self._report(key, entry)
            done = int(entry.get("round") or 0) >= self._max_t
            if cohort is not None and done and key in self._trials and key not in self._finished:
                if refilled:
                    self._ledger.note_left(self._trials[key], iteration)
                self._close(key, entry, False)  # a member that trained every round, in a cohort that goes on
        if refilled and not result.get("done"):
            self._refill_cohort(trial_id, iteration)

    def _report(self, trial_id: str, result: dict) -> None:
        if len(self._metrics) > 1:  # Optuna records no per-round values in multi-objective studies
            return
        value = result.get(self._metrics[0])
        if trial_id in self._finished or trial_id not in self._trials or value is None or not math.isfinite(value):
            return
        if not self._ledger.report(self._trials[trial_id], value, int(result["round"])):
            self._finished.add(trial_id)  # finished before an interrupted driver could save its state

    def _on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        cohort = getattr(self, "_cohorts", {}).get(trial_id)
        if cohort is not None:
            self.__dict__.setdefault("_tune_done", set()).add(trial_id)
            last = dict(member_results(trial_id, result or {}))
            for key in cohort:  # each member its own last result (a pruned one is closed already)
                # a member assigned to a refilled cohort that ended before it joined: no driver trained it
                untrained = key not in last and key in self._trials and key not in self._finished
                if untrained and self._ledger.interrupt_untrained(self._trials[key]):
                    self._finished.add(key)
                    continue
                self._close(key, last.get(key, {}), error)
            return
        self._close(trial_id, result, error)

    def _close(self, trial_id: str, result: dict | None, error: bool) -> None:
        if trial_id in self._finished or trial_id not in self._trials:
            return
        self._finished.add(trial_id)
        self._ledger.close(self._trials[trial_id], result, error, self._metrics, self._max_t)

    # ---- Tune's experiment snapshot: JSON, the rest is in the Optuna storage -------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "trials": self._trials,
            "finished": sorted(self._finished),
            "run": self._run_name,
            "budget": self._budget,
            "cohorts": getattr(self, "_cohorts", {}),
            "tune_done": sorted(getattr(self, "_tune_done", set())),
            "refilled": getattr(self, "_refilled", {}),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._trials = {str(k): int(v) for k, v in state["trials"].items()}
        self._finished = set(state["finished"])
        self._run_name, self._budget = state["run"], int(state["budget"])
        self._cohorts = {str(k): list(v) for k, v in state.get("cohorts", {}).items()}
        self._tune_done = set(state.get("tune_done", []))
        self._refilled = {str(k): dict(v) for k, v in state.get("refilled", {}).items()}

    def save(self, checkpoint_path: str) -> None:
        # never through a link planted in the experiment folder
        write_atomic(Path(checkpoint_path), json.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as f:
            self.set_state(json.load(f))
        # trials this run's dead driver created after Tune's last snapshot: Tune does not know
        # them; released, so that this run's next asks adopt and train them. The sampler needs no
        # reseeding: each trial's seed comes from the study (autofl/tuning/strategy/trial_sampler.py)
        self._ledger.release_unknown_orphans(self._run_name, set(self._trials))

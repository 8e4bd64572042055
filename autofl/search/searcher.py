"""Tune's OptunaSearch, with the per-round bookkeeping a study needs.

Stock OptunaSearch reports intermediate values by training iteration and records an ASHA-stopped
trial as COMPLETE with its early-round score. Here intermediate values are keyed by FL round, a
trial stopped before `max_t` rounds is recorded as PRUNED, and each Optuna trial carries the Tune
trial id, the round of its value and its (reported, never optimized) test metrics.
"""

from __future__ import annotations

import math
import pickle
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from autofl.engine.metrics import METRIC_KEYS

REPORTED_KEYS = (*METRIC_KEYS, "node_id")  # a round's metrics and the Ray node that trained it


def finished_in_run(trials: Iterable[FrozenTrial], run_name: str) -> set[str]:
    """Tune trial ids of the Optuna trials that `run_name` suggested and the study has finished."""
    return {t.user_attrs.get("tune_trial_id") for t in trials
            if t.state.is_finished() and t.user_attrs.get("tune_run") == run_name}


def fail_interrupted(study: Any, trial: FrozenTrial) -> None:
    """Record `trial` FAIL and `interrupted`: no driver will train it; counts and budgets replace it."""
    study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
    study.tell(trial.number, state=TrialState.FAIL)


def _shared(storage: Any) -> bool:
    """Whether several drivers may share this storage (PostgreSQL)."""
    return storage is not None and storage.engine.dialect.name == "postgresql"


@contextmanager
def shared_suggest_lock(storage: Any, study_name: str) -> Iterator[None]:
    """On PostgreSQL, a session advisory lock per study around count-then-create, so that drivers
    joined to one study never create more trials than it requested. SQLite has one driver."""
    if not _shared(storage):
        yield
        return
    from sqlalchemy import text

    key = zlib.crc32(f"autofl-study:{study_name}".encode())
    with storage.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            conn.commit()


def study_storage(study_root: str | Path):
    """Open the storage of the study in `study_root`: pickled searchers and stoppers carry the
    folder, never the storage URL (which may hold a password taken from the environment)."""
    from autofl.search.storage import open_storage
    from autofl.search.study import Study

    return open_storage(Study(Path(study_root)).storage_url())


class RoundAwareOptunaSearch(OptunaSearch):
    def __init__(self, *args: Any, max_t: int, run_name: str, budget: int, study_root: Path, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._max_t = max_t
        self._run_name = run_name
        self._budget = budget
        self._study_root = str(study_root)
        self._max_concurrent = 0  # no limit until Tune sets one

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune's `max_concurrent_trials`, applied here: Tune's ConcurrencyLimiter would forget its
        live trials on restore and then drop the resumed trials' results."""
        self._max_concurrent = max_concurrent
        return True

    # ----- pickling without the storage (Tune pickles searchers into tuner.pkl and its state files)
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_storage"] = None
        state["_ot_study"] = None
        state["_ot_trials"] = {tid: t._trial_id for tid, t in self._ot_trials.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attach()

    def _attach(self) -> None:
        """Reopen the study's storage and the Optuna trials after unpickling."""
        import optuna

        if self._ot_study is not None:
            return
        self._storage = study_storage(self._study_root)
        self._ot_study = optuna.load_study(study_name=self._study_name, storage=self._storage,
                                           sampler=self._sampler, pruner=optuna.pruners.NopPruner())
        self._ot_trials = {tid: t if isinstance(t, optuna.Trial) else optuna.Trial(self._ot_study, t)
                           for tid, t in self._ot_trials.items()}

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__getstate__(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self.__dict__.update(state)
        self._ot_study = None
        self._attach()
        self._fail_orphans_unknown_to_the_snapshot()

    def _fail_orphans_unknown_to_the_snapshot(self) -> None:
        """Trials this run's dead driver created after Tune's last snapshot: no one will train them
        (Tune does not know them), so they are recorded FAIL, interrupted, and replaced by new ones.
        Without this, every driver's count of the study's trials would include them."""
        known = set(self._ot_trials)
        with shared_suggest_lock(self._storage, self._study_name):  # no other driver is between ask and tag
            for t in self._ot_study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
                run = t.user_attrs.get("tune_run")
                mine = run == self._run_name or run is None  # untagged: killed between ask and tag
                if mine and t.user_attrs.get("tune_trial_id") not in known:
                    fail_interrupted(self._ot_study, t)

    def _budget_used(self, trials: list[FrozenTrial]) -> int:
        """Trials this searcher suggested, plus the run's trials finished by a driver that died
        before Tune saved them (still RUNNING ones are orphans to replace, not counted)."""
        interrupted = {t.user_attrs.get("tune_trial_id") for t in trials if t.user_attrs.get("interrupted")}
        finished = finished_in_run(trials, self._run_name) - interrupted
        return len(set(self._ot_trials) - interrupted) + len(finished - set(self._ot_trials))

    def _study_budget_reached(self, trials: list[FrozenTrial]) -> bool:
        """Every driver's trials together (interrupted ones are replaced, so not counted) against
        the study's `trials_requested` user attribute."""
        if not _shared(self._storage):  # SQLite: one driver, whose own budget is the rule
            return False
        requested = self._ot_study.user_attrs.get("trials_requested")
        if requested is None:
            return False
        # issue 18: a WAITING trial is an enqueued start point (the paper default) no driver has
        # taken yet; counting it spent the budget before it ran (trials: 1 on PostgreSQL ran nothing)
        counted = sum(1 for t in trials if not t.user_attrs.get("interrupted") and t.state != TrialState.WAITING)
        return counted >= int(requested)

    def suggest(self, trial_id: str) -> dict | str | None:
        if self._ot_study is None:
            return super().suggest(trial_id)
        live = len(set(self._ot_trials) - self._completed_trials)
        if self._max_concurrent and live >= self._max_concurrent:
            return None  # asked again when a trial completes
        with shared_suggest_lock(self._storage, self._study_name):
            trials = self._ot_study.get_trials(deepcopy=False)
            if self._budget_used(trials) >= self._budget or self._study_budget_reached(trials):
                return Searcher.FINISHED
            params = super().suggest(trial_id)  # creates the Optuna trial inside the lock
            if params is not None:  # tagged inside it too: an untagged RUNNING trial is an orphan
                self._ot_trials[trial_id].set_user_attr("tune_trial_id", trial_id)
                self._ot_trials[trial_id].set_user_attr("tune_run", self._run_name)
        return params

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if isinstance(self.metric, list):  # Optuna records no per-round values in multi-objective studies
            return
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
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [(result or {}).get(m) for m in metrics]
        value = None if any(v is None or not math.isfinite(v) for v in values) else values[0]
        rnd = int((result or {}).get("round", 0))
        fresh = rnd and rnd not in stored.intermediate_values  # Tune may hand the last result only here
        if value is not None and fresh and len(metrics) == 1:
            ot_trial.report(float(value), rnd)
        for key in REPORTED_KEYS:
            if result and result.get(key) is not None:
                ot_trial.set_user_attr(key, result[key])
        if result and result.get("diverged"):
            ot_trial.set_user_attr("fail_reason", str(result["diverged"]))
        if error or value is None or (result and result.get("diverged")):
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
        elif rnd < self._max_t:
            self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
        else:
            self._ot_study.tell(ot_trial, [float(v) for v in values] if len(values) > 1 else float(value),
                                state=TrialState.COMPLETE)

"""The study ledger: the one owner of a study's trials.

Every change of a trial's state goes through this module, as every change of an Optuna trial goes
through Optuna's `study/_tell.py`: a trial is created (`ask`), gets per-round values (`report`),
and is closed once (`close`, `interrupt`, `settle_run`, `fail_orphans`), each through Optuna's
public ask / tell (`skip_if_finished`: a trial another driver or a killed driver already closed
stays as it is). The rule of which state a finished trial takes is `outcome()`:

- FAIL: the trainable raised, diverged, or reported no finite value for every objective;
- PRUNED: it stopped before `max_t` rounds (ASHA, a budget, a stopper): its last value stands;
- COMPLETE: it trained all `max_t` rounds, with its final value(s).

A trial a killed driver left open is an orphan (`release_orphans`, `release_unknown_orphans`):
it stays RUNNING, marked `orphaned`, and the next ask of a resumed driver adopts it (trains it
again under a new Tune id) instead of creating a new trial, so a kill leaves no placeholder and
the study's trial numbers (which seed its sampler, autofl/tuning/strategy/trial_sampler.py) are those of an
uninterrupted run; a driver killed while it set a trial's params leaves it with some or none
of them, and the adopting ask sets the rest to what the killed driver would have set (the sampler
seeds each trial and each parameter drawn on its own). A trial no driver will train (a budget ended
the run before it started) is FAIL with the user attr `interrupted`, shown as INTERRUPTED
(`shown_state`), and is replaced, not counted, when trials are added. A trial carries the Tune
trial id (`tune_trial_id`) and the Tune experiment (`tune_run`) it ran under: the map between Tune's
ids and Optuna's numbers.

The live view, `status`, `report`, re-evaluation, the stoppers and the scheduler only read from
it (`trials`, `number_of`, `state_of`, `finished_in_run`, `rounds_used`, `rung_history`).

A Ledger pickles as its study folder only: Tune pickles the searcher, scheduler, stoppers and
callbacks that hold one, and each reopens the storage when first used (a storage URL may carry a
password taken from the environment; a connection does not pickle). A ledger unpickled while a
driver runs a study (`bound_to`) is that study's, whatever folder it was pickled in: a study
folder copied with `cp -a` and resumed writes into its own store, not the original's (issue 42).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from autofl.tuning.store.storage import is_journal, is_shared, journal_lock, open_storage
from autofl.tuning.store.study import CONFIG_ATTR, LEGACY_RECORD_KEYS, RECORD_ATTR, StudyFolder, record_of
from autofl.tuning.strategy.cohorts import cohort_of, member_index
from autofl.tuning.strategy.constraints import FEASIBLE_ATTR, constraint_values
from autofl.tuning.strategy.objectives import REPORTED_KEYS, direction
from autofl.tuning.strategy.repeats import (
    REPEAT_TRIES,
    ask_unseen,
    config_key,
    is_repeat,
    tell_as_twin,
    trained_configs,
)
from autofl.tuning.strategy.space import SearchSpace, grid_size

FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")
OPEN_STATES = ("RUNNING", "WAITING")
INTERRUPTED = "INTERRUPTED"  # shown for FAIL + interrupted, and for trials no live driver runs
# a refilled cohort's member: its params and the cohort's training iteration after which it joins
MEMBER_ATTR = "cohort_member"
LEFT_ATTR = "left_cohort_at"  # ... and the iteration at which a member left its refilled cohort


def outcome(
    result: dict[str, Any] | None, error: bool, metrics: Sequence[str], max_t: int
) -> tuple[str, list[float] | None]:
    """The state a trial takes when Tune reports it finished, and its value(s) for COMPLETE."""
    result = result or {}
    values: list[Any] = [result.get(m) for m in metrics]
    finite = all(v is not None and math.isfinite(v) for v in values)
    if error or not finite or result.get("diverged"):
        return "FAIL", None
    if int(result.get("round", 0)) < max_t:
        return "PRUNED", None
    return "COMPLETE", [float(v) for v in values]


def shown_state(state: str, user_attrs: dict[str, Any], live_driver: bool) -> str:
    """The state `status`, `studies` and the report show: Optuna's, except INTERRUPTED for a trial
    a killed or stopped driver left (FAIL marked interrupted, or RUNNING with no live main driver;
    a --join driver's trials stay RUNNING)."""
    if state == "FAIL" and user_attrs.get("interrupted"):
        return INTERRUPTED
    if state in OPEN_STATES and user_attrs.get("orphaned"):
        return INTERRUPTED  # a resumed driver trains it again
    joined = str(user_attrs.get("tune_run", "")).startswith("join-")
    if state in OPEN_STATES and not live_driver and not joined:
        return INTERRUPTED
    return state


def is_placeholder(trial: Any) -> bool:
    """Whether a trial is an interrupted placeholder: no driver trained it, and it holds no proposal
    of the study's sequence (autofl.tuning.strategy.trial_sampler.proposal_index skips it)."""
    return bool(trial.user_attrs.get("interrupted"))


def is_orphan(trial: Any) -> bool:
    """Whether a trial is an orphan: left running by a dead driver and released for an ask to adopt."""
    return trial.state.name == "RUNNING" and bool(trial.user_attrs.get("orphaned"))


def is_warm_started(trial: Any) -> bool:
    """Whether a trial was copied from another study (`autofl search --warm-start`): trained there."""
    return "warm_start_from" in trial.user_attrs


def counted(trial: Any) -> bool:
    """Whether a trial counts against the study's requested trials (interrupted ones are replaced;
    a repeat told its twin's outcome, autofl/tuning/strategy/repeats.py, and a warm-started trial copied
    from another study, autofl/tuning/strategy/warm_start.py, trained nothing here)."""
    return not trial.user_attrs.get("interrupted") and not is_repeat(trial) and not is_warm_started(trial)


def rounds_used(trials: Iterable[Any]) -> dict[str, int]:
    """Rounds each trial trained (its last reported round), keyed by Tune trial id; a repeat told
    its twin's rounds, and a trial warm-started from another study, trained none here."""
    return {
        str(t.user_attrs.get("tune_trial_id", f"#{t.number}")): max(t.intermediate_values, default=0)
        for t in trials
        if not is_repeat(t) and not is_warm_started(t)
    }


_bound_root: str | None = None  # the study folder this process drives (bound_to)


@contextmanager
def bound_to(study_root: str | Path) -> Iterator[None]:
    """While a driver restores and runs a Tune experiment of the study in `study_root`: every
    Ledger Tune unpickles (in its searcher, scheduler, stoppers, callbacks) is this study's."""
    global _bound_root
    before, _bound_root = _bound_root, str(study_root)
    try:
        yield
    finally:
        _bound_root = before


class Ledger:
    """The study in `study_root`, opened lazily; pickles as the folder name only."""

    def __init__(self, study_root: str | Path):
        self.root = str(study_root)
        self._study: Any = None  # optuna.Study, opened at first use in each process
        self._storage: Any = None  # the Optuna storage it was opened on
        self._url = ""  # and that storage's URL
        self._sampler: Any = None
        self._constraints: list[Any] | None = None  # the space's, read at the first close
        self._trial_ids: dict[int, int] = {}  # trial number -> the storage's trial id (fixed once created)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        Ledger.__init__(self, _bound_root or state["root"])

    def __repr__(self) -> str:
        return f"Ledger({self.root!r})"

    # ---- opening --------------------------------------------------------------------------------
    def folder(self):
        return StudyFolder(Path(self.root))

    def create(self, space: SearchSpace):
        """The Optuna study, made with `space`'s objective directions if it does not exist yet."""
        modes = space.modes if space.multi_objective else [space.mode]
        return self.study(create_directions=[direction(m) for m in modes or []])

    def study(self, sampler: Any = None, create_directions: list[Literal["maximize", "minimize"]] | None = None):
        """The Optuna study (None if it does not exist yet and no `create_directions` are given).
        `sampler` is the one `ask` uses (the searcher's); readers need none."""
        import optuna

        if self._study is not None and (sampler is None or sampler is self._sampler):
            return self._study

        folder = self.folder()
        if self._storage is None:
            self._url = folder.storage_url()
            self._storage = open_storage(self._url)
        storage = self._storage
        name = folder.optuna_name(storage)  # a copied study folder keeps its trials' old name
        try:
            if create_directions is not None:
                self._study = optuna.create_study(
                    study_name=name,
                    storage=storage,
                    sampler=sampler,
                    pruner=optuna.pruners.NopPruner(),
                    directions=create_directions,
                    load_if_exists=True,
                )
            else:
                self._study = optuna.load_study(
                    study_name=name, storage=storage, sampler=sampler, pruner=optuna.pruners.NopPruner()
                )
        except KeyError:
            return None
        self._sampler = sampler
        return self._study

    # ---- reading --------------------------------------------------------------------------------
    def trials(self, states: tuple[str, ...] | None = None) -> list[Any]:
        """The study's trials (FrozenTrial), optionally only those in `states` (names)."""
        study = self.study()
        if study is None:
            return []
        trials = study.get_trials(deepcopy=False)
        return trials if states is None else [t for t in trials if t.state.name in states]

    def trial_of(self, tune_trial_id: str) -> Any | None:
        """The FrozenTrial of a Tune trial id (the latest, if several runs used the id), else None."""
        for t in reversed(self.trials()):
            if t.user_attrs.get("tune_trial_id") == tune_trial_id:
                return t
        return None

    def number_of(self, tune_trial_id: str) -> int | None:
        """The Optuna trial number of a Tune trial id (the latest, if several runs used the id)."""
        trial = self.trial_of(tune_trial_id)
        return None if trial is None else trial.number

    def state_of(self, tune_trial_id: str) -> str | None:
        trial = self.trial_of(tune_trial_id)
        return None if trial is None else trial.state.name

    def feasible_of(self, tune_trial_id: str) -> bool:
        """Whether the trial meets the study's constraints (True where it has none, or is unknown)."""
        trial = self.trial_of(tune_trial_id)
        return trial is None or trial.user_attrs.get("feasible") is not False

    def finished_in_run(self, run_name: str) -> set[str]:
        """Tune trial ids of the trials that `run_name` ran and the study has finished."""
        return {
            t.user_attrs.get("tune_trial_id")
            for t in self.trials()
            if t.state.is_finished() and t.user_attrs.get("tune_run") == run_name
        }

    def rounds_used(self) -> dict[str, int]:
        return rounds_used(self.trials())

    def rung_history(
        self, rungs: Sequence[float], max_t: float, member: Callable[[Any], bool] | None = None
    ) -> dict[float, dict[str, float]]:
        """ASHA's rungs as the study's trials left them, by Tune trial id (objective units): each
        tagged, not interrupted trial's per-round values replayed through autofl.tuning.strategy.asha
        (only the trials `member`, given the FrozenTrial, accepts: one bracket's)."""
        from autofl.tuning.strategy.asha import recorded_values  # lazy: pulls numpy

        history: dict[float, dict[str, float]] = {m: {} for m in rungs}
        for t in self.trials():
            trial_id = t.user_attrs.get("tune_trial_id")
            if trial_id is None or not counted(t) or not t.intermediate_values:
                continue
            if member is not None and not member(t):
                continue
            for milestone, value in recorded_values(
                dict(t.intermediate_values), rungs, max_t, t.state.is_finished()
            ).items():
                history[milestone][trial_id] = value
        return history

    def requested(self) -> int | None:
        """The study's requested total (None before any was recorded: 0 is never one)."""
        return self.record()["trials_requested"] or None

    def record(self) -> dict[str, Any]:
        """What changes about the study as it runs (study.json keeps only what is fixed at creation):
        `runs` (one entry per driver run: name, trials asked for, module layout, Tune wall seconds),
        `trials_requested` (the study's total so far) and `root` (the folder its last run ran in).
        Kept in the Optuna storage's study attributes; a study made before 2026-11-28 keeps them in
        study.json until its next run moves them here."""
        return record_of(self.study(), self.folder().meta())

    def add_run(
        self, name: str, trials: int, layout: int, join: bool, top_up: bool = False, population: int | None = None
    ) -> dict[str, Any]:
        """Record a new driver run of `trials`: a main run adds them to the requested total and
        records the folder it runs in; a --join driver's run shares the total, and so does a
        `top_up` (trials the study requested before, which a killed run left unfinished: the total
        never dips, for a driver killed now or a --join driver counting against it). `population`: the
        width `resources.population: auto` chose, kept with the run. Returns the record after it."""
        with self.suggest_lock():  # several drivers of a shared study: one read-modify-write at a time
            record = self.record()
            run = {"name": name, "trials": trials, "layout": layout}
            if population is not None:  # what `resources.population: auto` chose (read back by recorded_width)
                run["population"] = population
            record["runs"] = [*record["runs"], run]
            if not join:
                record["trials_requested"] += 0 if top_up else trials
                record["root"] = str(Path(self.root).resolve())  # a joiner may mount the folder elsewhere
            self._write_record(record)
        folder = self.folder()
        meta = folder.meta()
        if any(key in meta for key in LEGACY_RECORD_KEYS):  # moved into the storage: one record
            folder.write_meta({k: v for k, v in meta.items() if k not in LEGACY_RECORD_KEYS})
        return record

    def add_wall(self, run_name: str, seconds: float) -> None:
        """Add `seconds` of Tune wall time to run `run_name`'s entry."""
        with self.suggest_lock():
            record = self.record()
            record["runs"] = [
                {**run, "tune_wall_s": round(run.get("tune_wall_s", 0.0) + seconds, 3)}
                if run["name"] == run_name
                else run
                for run in record["runs"]
            ]
            self._write_record(record)

    def _write_record(self, record: dict[str, Any]) -> None:
        self.study().set_user_attr(RECORD_ATTR, record)  # one write: the record changes whole

    # ---- writing: the only place trial states change ------------------------------------------
    def _trial(self, number: int):
        """A live handle on trial `number` (Optuna's public Trial over the storage). Making one calls the
        sampler's `before_trial` (autofl's reads every trial of the study): a write of one value goes
        through the storage instead (`_set_attr`, `report`)."""
        import optuna

        return optuna.trial.Trial(self.study(), self._trial_id(number))

    def _trial_id(self, number: int) -> int:
        """The storage's id of trial `number` (public storage API; Optuna's trial objects keep it private),
        looked up once: a trial's id never changes."""
        if number not in self._trial_ids:
            study = self.study()  # opens the storage
            self._trial_ids[number] = self._storage.get_trial_id_from_study_id_trial_number(
                self._storage.get_study_id_from_name(study.study_name), number
            )
        return self._trial_ids[number]

    def _set_attr(self, number: int, key: str, value: Any) -> None:
        """Trial `number`'s user attribute `key` (what `Trial.set_user_attr` writes, through the storage)."""
        trial_id = self._trial_id(number)  # opens the storage first
        self._storage.set_trial_user_attr(trial_id, key, value)

    def enqueue(self, points: Iterable[dict[str, Any]]) -> None:
        for point in points:
            self.study().enqueue_trial(point)

    @contextmanager
    def suggest_lock(self) -> Iterator[None]:
        """On PostgreSQL, a session advisory lock per study around count-then-create, so that
        drivers joined to one study never create more trials than it requested (on a journal, a
        lock file next to it). SQLite has one driver."""
        if not self.shared():
            yield
            return

        if is_journal(self._url):
            with journal_lock(self._url):
                yield
            return
        from sqlalchemy import text

        engine = self._storage.engine
        key = zlib.crc32(f"autofl-study:{self.folder().name}".encode())
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                conn.commit()

    def shared(self) -> bool:
        """Whether several drivers may share this storage (PostgreSQL, a journal)."""
        self.study()
        return is_shared(self._storage)

    def ask(
        self,
        run_name: str,
        tune_trial_id: str,
        known: set[str],
        budget: int,
        sampler: Any,
        define: Callable[[Any], dict[str, Any] | None],
        skip_repeats: bool = False,
    ) -> tuple[int, dict[str, Any]] | None:
        """A new trial for Tune trial `tune_trial_id` of `run_name`, tagged with both: its number
        and params; None when the run's `budget` (counting the `known` Tune ids its searcher
        handed out) or the study's requested total is reached. Count and create happen under
        the suggest lock, so no other driver is between them."""
        study = self.study(sampler=sampler)
        with self.suggest_lock():
            trials = study.get_trials(deepcopy=False)
            if self._run_budget_used(trials, run_name, known) >= budget:
                return None
            orphans = sorted((t for t in trials if is_orphan(t)), key=lambda t: t.number)
            if orphans:
                adopted = self._adopt_orphan(study, orphans, run_name, tune_trial_id, define, skip_repeats)
                if adopted is not None:
                    return adopted
                trials = study.get_trials(deepcopy=False)  # each orphan was a repeat, told as its twin
            if self._study_budget_reached(trials):
                return None
            if skip_repeats:  # a config a finished trial trained is told its outcome, not trained again
                space = getattr(define, "space", None)  # DefineByRun: its space's size, 0 if continuous
                trial, returned = ask_unseen(study, define, space_size=grid_size(space) if space else None)
            else:
                trial = study.ask()
                returned = define(trial)  # define-by-run: may return constants to add to the params
            trial.set_user_attr("tune_trial_id", tune_trial_id)  # inside the lock: untagged RUNNING = orphan
            trial.set_user_attr("tune_run", run_name)
        return trial.number, {**trial.params, **(returned if isinstance(returned, dict) else {})}

    def ask_member(
        self,
        run_name: str,
        member_id: str,
        known: set[str],
        budget: int,
        sampler: Any,
        define: Callable[[Any], dict[str, Any] | None],
        fixed: dict[str, Any],
        skip_repeats: bool = False,
    ) -> tuple[int, dict[str, Any]] | None:
        """Another member of a cohort (a population trial, autofl/tuning/strategy/cohorts.py) whose
        first member `ask` gave: a trial whose params include `fixed` (the first member's non-fusible
        values), tagged with `member_id`; None when the budget is reached, or when the study holds a
        trial an ask must take first that does not fit the cohort (an enqueued start point, an
        orphan of other values), so that the trials' numbers and params are those the asks of an
        uninterrupted run give. An orphan that fits (a member of the cohort a killed driver ran) is
        adopted: a killed cohort comes back whole. With `skip_repeats`, a proposal a finished trial
        trained is told as that twin and the sampler asked again, as `ask` does."""
        study = self.study(sampler=sampler)
        with self.suggest_lock():
            trials = study.get_trials(deepcopy=False)
            if self._run_budget_used(trials, run_name, known) >= budget:
                return None
            orphans = sorted((t for t in trials if is_orphan(t)), key=lambda t: t.number)
            if orphans:
                if any(orphans[0].params.get(k) != v for k, v in fixed.items()):
                    return None
                return self._adopt_orphan(study, orphans[:1], run_name, member_id, define, skip_repeats=False)
            if any(t.state.name == "WAITING" for t in trials) or self._study_budget_reached(trials):
                return None
            trial, returned = ask_unseen(study, define, tries=REPEAT_TRIES if skip_repeats else 0, fixed=fixed)
            trial.set_user_attr("tune_trial_id", member_id)  # inside the lock: untagged RUNNING = orphan
            trial.set_user_attr("tune_run", run_name)
        return trial.number, {**trial.params, **(returned if isinstance(returned, dict) else {})}

    def assign_member(self, number: int, params: dict[str, Any], joins_at: int) -> None:
        """Trial `number` (asked by `ask_member` for a refilled cohort, tagged with its member id) joins its
        cohort's worker after the cohort's training iteration `joins_at`, with `params`
        (autofl/tuning/strategy/cohorts.py); a later assignment (an orphan adopted again) replaces it."""
        self._set_attr(number, MEMBER_ATTR, {"params": params, "joins_at": int(joins_at)})

    def note_left(self, number: int, iteration: int) -> None:
        """Trial `number`, a member of a refilled cohort, left it (pruned, done, failed) at the cohort's training
        iteration `iteration`: a resumed driver that trains the cohort's earlier iterations again counts it
        as a member until then (`cohort_state`). Written before the trial is closed (a finished one keeps
        its attributes: nothing is written)."""
        if not self._frozen(number).state.is_finished():
            self._set_attr(number, LEFT_ATTR, int(iteration))

    def cohort_state(self, cohort: str, iteration: int) -> tuple[int, int]:
        """(members of Tune trial `cohort` at its training iteration `iteration`, the next free member index):
        its trials (not released as orphans) that had joined by then, less those that had left by then
        (`note_left`; a finished one that says nothing left earlier). Read from the study alone, so a driver
        resumed from an older snapshot, training the cohort's iterations again, counts as the first did."""
        members, used = 0, -1
        for t in self.trials():
            ids = [t.user_attrs.get("tune_trial_id"), *t.user_attrs.get("earlier_tune_trial_ids", [])]
            own = [str(i) for i in ids if i is not None and cohort_of(str(i)) == cohort and str(i) != cohort]
            used = max([used, *(member_index(i) for i in own)])
            if not own or cohort_of(str(ids[0])) != cohort or t.user_attrs.get("orphaned"):
                continue
            joined = int((t.user_attrs.get(MEMBER_ATTR) or {}).get("joins_at", -1))
            left = t.user_attrs.get(LEFT_ATTR, -1) if t.state.is_finished() else None
            members += joined <= iteration and not (left is not None and int(left) <= iteration)
        return members, used + 1

    def joining_members(self, cohort: str, iteration: int) -> list[dict[str, Any]]:
        """The members assigned to Tune trial `cohort` (a refilled cohort) that join by its training
        iteration `iteration` and are still running (not released as orphans): `{"id", "number",
        "params"}`, in member order. Reads the running trials only."""
        from optuna.trial import TrialState

        study = self.study()
        joining = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            tid = str(t.user_attrs.get("tune_trial_id", ""))
            entry = t.user_attrs.get(MEMBER_ATTR)
            if tid == cohort or cohort_of(tid) != cohort or not entry or t.user_attrs.get("orphaned"):
                continue
            if int(entry["joins_at"]) <= iteration:
                joining.append({"id": tid, "number": t.number, "params": entry["params"]})
        return sorted(joining, key=lambda m: member_index(m["id"]))

    def finished_numbers(self, numbers: Iterable[int]) -> set[int]:
        """Which of trials `numbers` the study has finished (a cohort's worker drops them: a member
        ASHA pruned, autofl/tuning/tune/scheduler.py)."""
        return {n for n in numbers if self._frozen(n).state.is_finished()}

    def _adopt_orphan(
        self,
        study: Any,
        orphans: list[Any],
        run_name: str,
        tune_trial_id: str,
        define: Callable[[Any], dict[str, Any] | None],
        skip_repeats: bool,
    ) -> tuple[int, dict[str, Any]] | None:
        """The first of `orphans` (`release`; lowest number first), handed to Tune trial
        `tune_trial_id` of `run_name` to train again from its first round: its number and params, or
        None if none is left to train. The define-by-run returns the params the orphan holds and sets those its
        killed driver had not set yet. An orphan killed before its tag may be a config a finished
        trial trained: with `skip_repeats` it is told as that twin, as its driver would have."""
        import optuna

        for orphan in orphans:
            trial = optuna.trial.Trial(study, self._trial_id(orphan.number))
            returned = define(trial)  # stored params come back as they are
            if skip_repeats and orphan.user_attrs.get("tune_trial_id") is None:
                twin = trained_configs(study).get(config_key(trial.params))
                if twin is not None:
                    tell_as_twin(study, trial, twin)
                    continue
            earlier = [*orphan.user_attrs.get("earlier_tune_trial_ids", []), orphan.user_attrs.get("tune_trial_id")]
            trial.set_user_attr("earlier_tune_trial_ids", [t for t in earlier if t is not None])
            trial.set_user_attr("tune_trial_id", tune_trial_id)
            trial.set_user_attr("tune_run", run_name)
            trial.set_user_attr("orphaned", False)
            # a refilled cohort's member loses its assignment: the refill that adopts it assigns it again
            if orphan.user_attrs.get(MEMBER_ATTR):
                trial.set_user_attr(MEMBER_ATTR, None)
            return orphan.number, {**trial.params, **(returned if isinstance(returned, dict) else {})}
        return None

    def _run_budget_used(self, trials: list[Any], run_name: str, known: set[str]) -> int:
        """Trials the run's searcher handed out, plus the run's trials finished by a driver that
        died before Tune saved them (still RUNNING ones are orphans to replace, not counted)."""
        interrupted = {t.user_attrs.get("tune_trial_id") for t in trials if not counted(t)}
        finished = {
            t.user_attrs.get("tune_trial_id")
            for t in trials
            if t.state.is_finished() and t.user_attrs.get("tune_run") == run_name
        } - interrupted
        return len(known - interrupted) + len(finished - known)

    def _study_budget_reached(self, trials: list[Any]) -> bool:
        """Every driver's trials together against the study's requested total (PostgreSQL only:
        on SQLite one driver's own budget is the rule)."""
        if not self.shared():
            return False
        requested = self.requested()
        # a WAITING trial is an enqueued start point (the paper default) no driver has taken yet;
        # counting it spent the budget before it ran (issue 18: trials: 1 on PostgreSQL ran nothing)
        return requested is not None and sum(1 for t in trials if counted(t) and t.state.name != "WAITING") >= requested

    def report(self, number: int, value: float, rnd: int) -> bool:
        """Record a round's value; False if the trial is already finished (closed by a driver that
        was killed before Tune saved its state)."""
        from optuna.exceptions import UpdateFinishedTrialError

        stored = self._frozen(number)
        if stored.state.is_finished():
            return False
        if int(rnd) in stored.intermediate_values:
            return True  # an adopted orphan trained again: its earlier attempt recorded this round
        try:  # what `Trial.report` writes (a single-objective study's value at step `rnd`), through the storage
            self._storage.set_trial_intermediate_value(self._trial_id(number), int(rnd), float(value))
        except UpdateFinishedTrialError:
            return False
        return True

    def close(self, number: int, result: dict[str, Any] | None, error: bool, metrics: Sequence[str], max_t: int) -> str:
        """Tune reports the trial finished: record its last result and close it as `outcome()`
        says; a trial already finished keeps its state. Returns the trial's state."""
        stored = self._frozen(number)
        if stored.state.is_finished():
            return stored.state.name
        result = result or {}
        state, values = outcome(result, error, metrics, max_t)
        trial = self._trial(number)
        rnd = int(result.get("round", 0))
        value = result.get(metrics[0])
        fresh = rnd and rnd not in stored.intermediate_values  # Tune may hand the last result only here
        if len(metrics) == 1 and fresh and value is not None and math.isfinite(value):
            trial.report(float(value), rnd)
        for key in REPORTED_KEYS:
            if result.get(key) is not None:
                trial.set_user_attr(key, result[key])
        if result.get("diverged"):
            trial.set_user_attr("fail_reason", str(result["diverged"]))
        if state == "COMPLETE":  # a PRUNED trial has no final metrics: no constraint values (as in Optuna)
            self._record_constraints(trial, result)
        self._tell(number, state, values)
        return state

    def constraints(self) -> list[Any]:
        """The study's constraints (its space's `constraints:`, autofl/tuning/strategy/constraints.py)."""
        if self._constraints is None:
            self._constraints = self.folder().stored_space().parsed_constraints
        return self._constraints

    def _record_constraints(self, trial: Any, result: dict[str, Any]) -> None:
        """A COMPLETE trial's constraint values (Optuna's `Trial.set_constraint`, what the samplers
        and `best_trial` read) and whether it meets them all (user attr `feasible`)."""
        constraints = self.constraints()
        if not constraints:
            return
        values = constraint_values(constraints, result)
        for key, value in values.items():
            trial.set_constraint(key, value)
        trial.set_user_attr(FEASIBLE_ATTR, all(v <= 0 for v in values.values()))

    def record_config(self, number: int, config: dict[str, Any]) -> None:
        """Keep trial `number`'s runnable config (`autofl.tuning.store.study.CONFIG_ATTR`) with it."""
        self._set_attr(number, CONFIG_ATTR, config)

    def interrupt(self, number: int) -> None:
        """No driver will train this trial: FAIL + interrupted (counts and budgets replace it)."""
        self._set_attr(number, "interrupted", True)
        self._tell(number, "FAIL", None)

    def interrupt_untrained(self, number: int) -> bool:
        """Interrupt trial `number` (`interrupt`) if it is open and reported no round: a refilled cohort's
        member whose cohort ended before it joined. True if it was."""
        stored = self._frozen(number)
        if stored.state.is_finished() or stored.intermediate_values:
            return False
        self.interrupt(number)
        return True

    def _tell(self, number: int, state: str, values: list[float] | None) -> None:
        from optuna.trial import TrialState

        study = self.study()
        value = None if values is None else (values if len(values) > 1 else values[0])
        study.tell(number, value, state=TrialState[state], skip_if_finished=True)

    def _frozen(self, number: int):
        trial_id = self._trial_id(number)  # opens the storage first
        return self._storage.get_trial(trial_id)

    def release(self, trial: Any) -> None:
        """A trial its driver left open: an orphan the next ask adopts (`_adopt_orphan`), whether
        its driver had tagged it or was killed while setting its params (no placeholder: CI's kill
        stress, 2026-11-27, left two from kills just after a trial finished, as the next was asked)."""
        self._set_attr(trial.number, "orphaned", True)

    def release_unknown_orphans(self, run_name: str, known: set[str]) -> int:
        """Trials of `run_name` (or untagged: killed between ask and tag) still running that the
        restored searcher does not know: created after Tune's last snapshot, no one trains them,
        so they are released (`release`). Returns how many. (A WAITING trial is an enqueued start
        point the next ask takes, as an uninterrupted run's would.)"""
        released = 0
        with self.suggest_lock():  # no other driver is between ask and tag
            for t in self.trials(("RUNNING",)):
                run = t.user_attrs.get("tune_run")
                mine = run == run_name or run is None
                if mine and t.user_attrs.get("tune_trial_id") not in known and not t.user_attrs.get("orphaned"):
                    self.release(t)
                    released += 1
        return released

    def release_orphans(self) -> int:
        """Trials left running by a killed main driver that no Tune experiment will finish (a --join
        driver's trials are left alone: it may be running them now): released (`release`), for
        the next run to adopt. Returns how many."""
        with self.suggest_lock():  # no other driver is between ask and tag
            orphans = [
                t
                for t in self.trials(("RUNNING",))
                if not t.user_attrs.get("orphaned") and not str(t.user_attrs.get("tune_run", "")).startswith("join-")
            ]
            for t in orphans:
                self.release(t)
        return len(orphans)

    def fail_orphans(self) -> int:
        """Trials still open once a driver's last experiment is over, which no run of it will adopt
        (a --join driver's trials are left alone: it may be running them now): interrupted.
        Returns how many."""
        orphans = [t for t in self.trials(OPEN_STATES) if not str(t.user_attrs.get("tune_run", "")).startswith("join-")]
        for t in orphans:
            self.interrupt(t.number)
        return len(orphans)

    def open_in_run(self, run_name: str) -> list[Any]:
        return [t for t in self.trials(OPEN_STATES) if t.user_attrs.get("tune_run") == run_name]

    def _open_with_last(self, run_name: str, last: dict[str, dict[str, Any]]) -> Iterator[tuple[Any, dict[str, Any]]]:
        """The trials of `run_name` still open that `last` (Tune's last result, by Tune trial id)
        holds a result with a round of, with that result."""
        for t in self.open_in_run(run_name):
            result = last.get(str(t.user_attrs.get("tune_trial_id")))
            if result and result.get("round"):
                yield t, result

    def record_last_results(self, run_name: str, last: dict[str, dict[str, Any]], metric: str) -> int:
        """Record, for the trials of `run_name` still open, the round of Tune's last result
        (`last`, by Tune trial id) that the ledger has not recorded. Returns how many."""
        recorded = 0
        for t, result in self._open_with_last(run_name, last):
            rnd, value = int(result["round"]), result.get(metric)
            if rnd not in t.intermediate_values and value is not None and math.isfinite(value):
                recorded += self.report(t.number, float(value), rnd)
        return recorded

    def close_open(self, run_name: str, last: dict[str, dict[str, Any]], metrics: Sequence[str], max_t: int) -> int:
        """A budget ended `run_name`: close each of its open trials that Tune holds a last result
        of (`last`, by Tune trial id) as that result says (`outcome()`: all rounds trained is
        COMPLETE, fewer PRUNED). Returns how many."""
        closed = 0
        for t, result in self._open_with_last(run_name, last):
            self.close(t.number, result, False, metrics, max_t)
            closed += 1
        return closed

    def settle_run(self, run_name: str) -> int:
        """A budget ended `run_name`: its trials still open are PRUNED if they trained (their last
        value stands), else interrupted (replaced if trials are added). Returns how many."""
        still_open = self.open_in_run(run_name)
        for t in still_open:
            if t.intermediate_values:
                self._tell(t.number, "PRUNED", None)
            else:
                self.interrupt(t.number)
        return len(still_open)

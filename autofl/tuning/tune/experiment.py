"""One Tune experiment of a study: the trainable with the study's data and resources, the
searcher, scheduler and stoppers on the study ledger, the live view, and what happens when Tune
returns (the ledger settles a run a budget ended; an interrupted run stays resumable).

Each invocation is one Tune experiment under `<study>/tune/<run>`; autofl/tuning/tune/runner.py
decides which (new, restored, added, joined).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from autofl.errors import AutoFLError
from autofl.tuning.store import write_failure
from autofl.tuning.store.ledger import Ledger, bound_to, is_warm_started
from autofl.tuning.store.study import StudyFolder
from autofl.tuning.strategy.build import make_sampler, study_start_points
from autofl.tuning.strategy.build import make_scheduler as from_space
from autofl.tuning.strategy.cohorts import member_results
from autofl.tuning.strategy.repeats import config_key
from autofl.tuning.strategy.space import DefineByRun, SearchSpace
from autofl.tuning.strategy.warm_start import warm_configs
from autofl.tuning.tune import ray_start  # by module: a test stands in for Ray by replacing init_ray
from autofl.tuning.tune.checkpoints import checkpoints_to_keep


class StudyIncomplete(AutoFLError):
    """Tune returned with trials of the run unfinished and no signal came: not an interruption
    (never exit 130 without a signal); the next --resume trains what is missing."""

    exit_code = 1


class StudyInterrupted(AutoFLError):
    """Ctrl-C during a run: Tune saved its state; the study resumes with --resume."""

    exit_code = 130

    @classmethod
    def of(cls, study_name: str) -> StudyInterrupted:
        return cls(f"interrupted; study {study_name!r} is saved: resume it with autofl search --resume {study_name!r}")


def make_searcher(
    space: SearchSpace, ledger: Ledger, run_name: str, trials: int, with_start_point: bool, sampler: Any = None
):
    from autofl.tuning.tune.searcher import StudySearcher  # lazy: pulls ray

    points = study_start_points(space)
    if with_start_point and points:  # a start point a warm-started trial trained is not trained again
        warm = warm_configs(ledger.trials())
        points = [p for p in points if config_key(p) not in warm]
    return StudySearcher(
        ledger,
        DefineByRun(space),
        sampler if sampler is not None else make_sampler(space, run_name),
        metric=space.metrics if space.multi_objective else space.objective,
        mode=list(space.modes or []) if space.multi_objective else space.mode,
        max_t=space.max_rounds,
        run_name=run_name,
        budget=trials,
        # issue 18: never more start points than the run's budget (a cross-method study with fewer
        # trials than methods left the rest WAITING forever)
        points_to_evaluate=points[:trials] if with_start_point else None,
        skip_repeats=space.sampler.skip_repeats,
        population=space.resources.population_width,
        base=space.base,
        # ASHA and Hyperband prune members: their cohorts are refilled (autofl/tuning/strategy/cohorts.py)
        refill=space.scheduler.kind in ("asha", "hyperband"),
        method_base=space.method_base,
    )


def make_scheduler(space: SearchSpace, ledger: Ledger):
    """The space's scheduler (autofl/tuning/strategy/build.py), ASHA's rungs read from the ledger."""
    return from_space(space, ledger)


def make_stopper(space: SearchSpace, ledger: Ledger, run_name: str):
    from ray.tune.stopper import CombinedStopper

    from autofl.tuning.tune.stopper import AlreadyRecordedStopper, RoundBudgetStopper  # lazy: pulls ray

    recorded = AlreadyRecordedStopper(ledger, run_name)
    if space.budget_rounds is None:
        return recorded
    return CombinedStopper(recorded, RoundBudgetStopper(ledger, space.budget_rounds))


def study_trainable(
    space: SearchSpace,
    trainable: type | None = None,
    checkpoint_every_s: float | None = None,
    study_root: str | None = None,
    **extra: Any,
):
    """`trainable` (default FLTrainable; a search's with `resources.population` > 1 and its study
    folder `study_root`: CohortTrainable) with the study's base config, dataset, threads and
    resources; `extra` goes to its setup too (e.g. a re-evaluation's run list)."""
    from ray import tune

    from autofl.data.datasets import load_raw_dataset  # lazy: pulls torch
    from autofl.tuning.tune.trainable import FLTrainable  # lazy: pulls torch and ray

    raw = load_raw_dataset(space.base_experiment().data)  # once; tune.with_parameters shares it via the object store
    if trainable is None and space.resources.population_width > 1 and study_root is not None:
        from autofl.tuning.tune.cohort_trainable import CohortTrainable  # lazy: pulls torch and ray

        trainable = CohortTrainable  # population trials: a cohort of configs per trial
        extra = {**extra, "study_root": study_root, "objective": space.objective, "mode": space.mode}
    wrapped = tune.with_parameters(
        trainable or FLTrainable,
        base=space.base,
        method_base=space.method_base,
        raw_data=raw,
        threads=max(1, int(space.resources.cpu)),
        checkpoint_every_s=space.checkpoint_every_s if checkpoint_every_s is None else checkpoint_every_s,
        **extra,
    )
    return tune.with_resources(wrapped, {"cpu": space.resources.cpu, "gpu": space.resources.gpu_share})


# which module layout a run's saved Tune experiment names (Tune pickles the trainable, searcher,
# scheduler and callbacks by module path): 2 since tuning/ was split into store, strategy and tune.
# A run of another layout is not restored (autofl.tuning.tune.runner.interrupted_run).
RUN_LAYOUT = 2


def new_run(
    study: StudyFolder, ledger: Ledger, trials: int, join: bool, top_up: bool = False, population: int | None = None
) -> tuple[str, bool]:
    """Record a new run of `trials` in the study's record (the ledger's; see Ledger.add_run): its
    name, and whether it starts with the space's start points: a main run of a study that holds no
    trial of its own yet (warm-started ones are another study's), so a first run killed before it
    enqueued them is followed by one that does."""
    ledger.create(study.space())  # the record is kept in it
    number = len(ledger.record()["runs"]) + 1
    # a --join driver runs its own Tune experiment; the study's requested total is unchanged
    run_name = f"join-{socket.gethostname()}-{os.getpid()}-{number}" if join else f"run-{number}"
    ledger.add_run(run_name, trials, RUN_LAYOUT, join, top_up, population=population)
    return run_name, not join and all(is_warm_started(t) for t in ledger.trials())


def run_experiment(
    study: StudyFolder,
    trials: int,
    address: str | None,
    restore: str | None = None,
    join: bool = False,
    top_up: bool = False,
) -> None:
    """Run `trials` new trials (or restore the interrupted experiment at `restore`). A joined
    driver (`join`) runs its own experiment and takes trials from the study's shared budget; a
    `top_up` runs trials the study requested before (its total is unchanged)."""
    with bound_to(study.root):  # a Tune experiment copied with its study folder is the copy's
        _run_experiment(study, trials, address, restore, join, top_up)


def _run_experiment(
    study: StudyFolder, trials: int, address: str | None, restore: str | None, join: bool, top_up: bool
) -> None:
    from ray import tune

    from autofl.tuning.tune import interrupt  # lazy: pulls ray
    from autofl.tuning.tune.live_view import LiveView, close_all  # lazy: pulls ray

    space = study.space()
    ledger = Ledger(study.root)
    ray_start.init_ray(address)
    # no test split is read before the study ends
    trainable = study_trainable(space, seal_test=True, study_root=str(study.root))
    if restore is not None:
        tuner = tune.Tuner.restore(
            restore, trainable=trainable, resume_unfinished=True, resume_errored=False, restart_errored=False
        )
        run_name = restore.rstrip("/").rsplit("/", 1)[-1]
    else:
        # what `population: auto` chose is kept with the run: later drivers of the study form the same cohorts
        width = space.resources.population_width if space.resources.population_measured else None
        run_name, with_start = new_run(study, ledger, trials, join, top_up, width)
        searcher = make_searcher(space, ledger, run_name, trials, with_start_point=with_start)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                scheduler=make_scheduler(space, ledger),
                metric=space.objective,
                mode=space.mode,
                num_samples=trials,
                time_budget_s=space.time_budget_s,
                reuse_actors=True,
                max_concurrent_trials=ray_start.max_concurrent(space),
            ),
            run_config=tune.RunConfig(
                name=run_name,
                storage_path=study.tune_root(),
                # the trainable asks for a checkpoint (should_checkpoint) once checkpoint_every_s of
                # training is unsaved; plus one at the end
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=0, num_to_keep=checkpoints_to_keep(space), checkpoint_at_end=True
                ),
                failure_config=tune.FailureConfig(max_failures=space.max_failures),
                stop=make_stopper(space, ledger, run_name),
                # the live view replaces Tune's reporter; the watch notes a Ctrl-C
                callbacks=[LiveView(ledger), interrupt.InterruptWatch()],
                verbose=0,
            ),
        )

    write_failure.forget()
    started = time.time()
    with interrupt.watching():
        try:
            grid = tuner.fit()
        finally:
            close_all()
    failed = write_failure.first_noted()
    if failed is not None and not interrupt.received():  # the study is as the failed write left it: resumable
        raise write_failure.WriteFailed.of(study.name, failed)
    ledger.add_wall(run_name, time.time() - started)
    settle_run(study, space, ledger, run_name, last_results(grid), interrupted=interrupt.received())


def last_results(grid: Any) -> dict[str, dict[str, Any]]:
    """Each trial's last result as Tune kept it (ResultGrid), by Tune trial id (a population trial's:
    each member's, by member id)."""
    last = {}
    for result in grid:
        metrics = result.metrics or {}
        if "trial_id" in metrics:
            # a population trial's members: each its own result, by the member id the ledger tags
            for key, entry in member_results(str(metrics["trial_id"]), metrics):
                last[key] = entry
    return last


def settle_run(
    study: StudyFolder,
    space: SearchSpace,
    ledger: Ledger,
    run: str,
    last: dict[str, dict[str, Any]] | None = None,
    interrupted: bool = False,
) -> None:
    """After Tune returns: if trials of this run are still open, or a Ctrl-C stopped Tune
    (`interrupted`, even at a moment no trial was open), either a budget ended the run (the ledger
    records the trials it cut PRUNED, those it never started interrupted) or the driver was
    interrupted (Tune saved its state; the run stays resumable).

    When the budget stopper ends the experiment, Tune stops the live trials without telling the
    searcher, and a result Tune was still holding (a trial's last round, waiting for its end-of-trial
    checkpoint) never reached the ledger; `last` (Tune's last result of each trial) is recorded
    first, so the ledger counts the rounds the stopper counted, and a trial it holds a result of is
    closed as that result says (a trial that trained every round is COMPLETE)."""
    if not ledger.open_in_run(run) and not interrupted:
        return
    if last and not space.multi_objective:
        ledger.record_last_results(run, last, space.objective)
    if not budget_spent(study, space, ledger, run):
        if interrupted:
            raise StudyInterrupted.of(study.name)
        left = len(ledger.open_in_run(run))
        raise StudyIncomplete(
            f"study {study.name!r}: the run ended with {left} trial(s) unfinished and no "
            f"interruption (see {study.root / 'logs'}); resume it with autofl search --resume "
            f"{study.name!r}"
        )
    if last:
        ledger.close_open(run, last, space.metrics if space.multi_objective else [space.objective], space.max_rounds)
    ledger.settle_run(run)


def budget_spent(study: StudyFolder, space: SearchSpace, ledger: Ledger, run: str) -> bool:
    """Whether the study's round budget, or run `run`'s time budget, is spent."""
    walls = [r.get("tune_wall_s", 0.0) for r in ledger.record()["runs"] if r["name"] == run]
    return bool(
        (space.budget_rounds is not None and sum(ledger.rounds_used().values()) >= space.budget_rounds)
        or (space.time_budget_s is not None and walls and walls[-1] >= 0.95 * space.time_budget_s)
    )

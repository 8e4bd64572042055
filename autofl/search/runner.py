"""Run a study with Ray Tune: OptunaSearch (the space's sampler, RDB storage) proposes, its scheduler stops, trials train.

Each invocation is one Tune experiment under `<study>/tune/run-<k>`. Resuming restores the last
interrupted experiment with Tune's own restore (searcher state, finished trials and trial
checkpoints included); adding trials to a finished study starts a new experiment on the same
Optuna study, so TPE sees every earlier trial.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from autofl.errors import AutoFLError
from autofl.search.space import DefineByRun, SearchSpace
from autofl.search.study import FINISHED, Study, trial_rows

# Tune writes its experiment state (trials, searcher) at most this often; a killed driver loses
# at most this much bookkeeping, and Optuna's storage is written at every trial event anyway.
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's classic output engine: silent at verbose=0
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


class StudyInterrupted(AutoFLError):
    """Ctrl-C during a run: Tune saved its state; the study resumes with --resume."""

    exit_code = 130


def init_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    # Ray's log records go where autofl.search.logs routes them (the study's logs/ folder); without
    # routing (e.g. in tests) Ray's own stderr handler, installed when ray is imported, stays
    common = dict(include_dashboard=False, configure_logging=False, log_to_driver=True)
    if address is not None:
        ray.init(address=address, **common)
        return
    # a Ray of our own (never whatever cluster /tmp/ray names), on this machine's CPUs: stating them
    # saves Ray's resource probe (measured: init 2.3 s instead of 3.3 s on 2 cores)
    ray.init(address="local", num_cpus=len(os.sched_getaffinity(0)), _node_ip_address="127.0.0.1", **common)


def concurrent_slots(resources: dict[str, float], space: SearchSpace) -> int:
    """How many of the study's trials the cluster's `resources` hold at once (at least one)."""
    slots = resources.get("CPU", 0.0) // space.resources.cpu
    if space.resources.gpu > 0:
        slots = min(slots, resources.get("GPU", 0.0) // space.resources.gpu)
    from autofl.search.preflight import memory_slots  # issue 18: a tiny cpu share is bounded by memory too

    slots = min(slots, memory_slots(resources) or slots)
    return max(1, int(slots))


def _max_concurrent(space: SearchSpace) -> int:
    """Trials in flight at once: the space's `resources.max_concurrent`, else one per slot of the
    cluster. Tune then keeps that many trials pending (with a searcher it keeps one by default),
    so every slot's worker starts at once; with one pending trial, a trial shorter than a worker's
    start (import torch, build the simulation: seconds) went to the first reused worker while the
    other nodes' workers were still starting, and a cluster trained one trial at a time."""
    import ray

    return space.resources.max_concurrent or concurrent_slots(ray.cluster_resources(), space)


def checkpoints_to_keep(space: SearchSpace) -> int | None:
    """How many checkpoints each trial keeps (None: all). A resumed run restores every trial from
    the checkpoint named in Tune's last experiment snapshot, written at most every
    TUNE_GLOBAL_CHECKPOINT_S; keeping 2 deletes older ones as new ones come, so checkpoints closer
    together than the snapshot (checkpoint_every_s: 0 saves every round) could delete the one the
    snapshot names before a kill, and the resumed trial then failed ("does not exist on storage
    anymore"; seen once in CI's two-node test). Such trials keep all theirs; the default (30 s) keeps 2."""
    snapshot_s = float(os.environ.get("TUNE_GLOBAL_CHECKPOINT_S", "2"))
    return None if space.checkpoint_every_s < 2 * snapshot_s else 2


def _searcher(space: SearchSpace, study: Study, run_name: str, trials: int, with_start_point: bool):
    from autofl.search.searcher import RoundAwareOptunaSearch
    from autofl.search.storage import open_storage
    from autofl.search.strategy import make_sampler, study_start_points

    # issue 18: never enqueue more start points than the run's budget (a cross-method study with
    # fewer trials than methods left the rest WAITING forever)
    start = study_start_points(space)[:trials] if with_start_point else []
    return RoundAwareOptunaSearch(
        space=DefineByRun(space), metric=space.metrics if space.multi_objective else space.objective,
        mode=space.modes if space.multi_objective else space.mode,
        points_to_evaluate=start or None,
        sampler=make_sampler(space),
        storage=open_storage(study.storage_url()),
        study_name=study.optuna_name(), max_t=space.max_rounds, run_name=run_name, budget=trials, study_root=study.root,
    )


def _scheduler(space: SearchSpace, study: Study):
    from autofl.search.strategy import make_scheduler

    return make_scheduler(space, study.root)


def study_trainable(space: SearchSpace, trainable: type | None = None, checkpoint_every_s: float | None = None,
                    **extra: Any):
    """`trainable` (default FLTrainable) with the study's base config, dataset, threads and
    resources; `extra` goes to its setup too (e.g. a re-evaluation's run list)."""
    from ray import tune

    from autofl.data.datasets import load_raw_dataset
    from autofl.search.trainable import FLTrainable

    raw = load_raw_dataset(space.base_experiment().data)  # once; tune.with_parameters shares it via the object store
    wrapped = tune.with_parameters(trainable or FLTrainable, base=space.base, method_base=space.method_base,
                                   raw_data=raw, threads=max(1, int(space.resources.cpu)),
                                   checkpoint_every_s=space.checkpoint_every_s if checkpoint_every_s is None
                                   else checkpoint_every_s, **extra)
    return tune.with_resources(wrapped, {"cpu": space.resources.cpu, "gpu": space.resources.gpu})


def _stopper(space: SearchSpace, study: Study, run_name: str):
    from ray.tune.stopper import CombinedStopper

    from autofl.search.stopper import AlreadyRecordedStopper, RoundBudgetStopper

    recorded = AlreadyRecordedStopper(study.root, run_name)
    if space.budget_rounds is None:
        return recorded
    return CombinedStopper(recorded, RoundBudgetStopper(study.root, space.budget_rounds))


def run_experiment(study: Study, trials: int, address: str | None, restore: str | None = None,
                   join: bool = False) -> None:
    """Run `trials` new trials (or restore the interrupted experiment at `restore`). A joined
    driver (`join`) runs its own experiment and takes trials from the study's shared budget."""
    from ray import tune

    from autofl.search.live_view import LiveView, close_all

    space = study.space()
    init_ray(address)
    trainable = study_trainable(space)
    if restore is not None:
        tuner = tune.Tuner.restore(restore, trainable=trainable, resume_unfinished=True,
                                   resume_errored=False, restart_errored=False)
    else:
        meta = study.meta()
        if join:  # its own Tune experiment; the study's requested total is unchanged
            run_name = f"join-{socket.gethostname()}-{os.getpid()}-{len(meta['runs']) + 1}"
        else:
            run_name = f"run-{len(meta['runs']) + 1}"
            meta["trials_requested"] = meta.get("trials_requested", 0) + trials
        meta["runs"].append({"name": run_name, "trials": trials})
        study.write_meta(meta)
        searcher = _searcher(space, study, run_name, trials, with_start_point=len(meta["runs"]) == 1 and not join)
        if not join:  # what every driver of the study counts against (PostgreSQL: several drivers)
            searcher._ot_study.set_user_attr("trials_requested", meta["trials_requested"])
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                scheduler=_scheduler(space, study), metric=space.objective, mode=space.mode, num_samples=trials,
                time_budget_s=space.time_budget_s, reuse_actors=True, max_concurrent_trials=_max_concurrent(space),
            ),
            run_config=tune.RunConfig(
                name=run_name, storage_path=study.tune_root(),
                # the trainable asks for a checkpoint (should_checkpoint) once checkpoint_every_s of
                # training is unsaved; plus one at the end
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, num_to_keep=checkpoints_to_keep(space),
                                                        checkpoint_at_end=True),
                failure_config=tune.FailureConfig(max_failures=space.max_failures),
                stop=_stopper(space, study, run_name),
                callbacks=[LiveView(str(study.root))], verbose=0,  # the live view replaces Tune's reporter
            ),
        )
    started = time.time()
    try:
        tuner.fit()
    finally:
        close_all()
    run = restore.rstrip("/").rsplit("/", 1)[-1] if restore is not None else run_name
    _record_wall(study, run, time.time() - started)
    _settle_run(study, space, run)


def _settle_run(study: Study, space: SearchSpace, run: str) -> None:
    """After Tune returns: if trials of this run are still open in Optuna, either a budget ended the
    run (the trials it cut are recorded PRUNED, those it never started FAIL + interrupted) or the
    driver was interrupted (Ctrl-C: Tune saved its state; the run stays resumable)."""
    from optuna.trial import TrialState

    from autofl.search.searcher import fail_interrupted
    from autofl.search.stopper import rounds_used

    ot = study.load_optuna()
    if ot is None:
        return
    trials = ot.get_trials(deepcopy=False)
    open_trials = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)
                   and t.user_attrs.get("tune_run") == run]
    if not open_trials:
        return
    walls = [r.get("tune_wall_s", 0.0) for r in study.meta()["runs"] if r["name"] == run]
    budget_spent = (
        (space.budget_rounds is not None and sum(rounds_used(trials).values()) >= space.budget_rounds)
        or (space.time_budget_s is not None and walls and walls[-1] >= 0.95 * space.time_budget_s))
    if not budget_spent:
        raise StudyInterrupted(f"interrupted; study {study.name!r} is saved: resume it with "
                               f"autofl search --resume {study.name!r}")
    for t in open_trials:
        if t.intermediate_values:
            ot.tell(t.number, state=TrialState.PRUNED)  # cut by the budget: its last value stands
        else:
            fail_interrupted(ot, t)  # never trained: replaced if trials are added


def _record_wall(study: Study, run_name: str, seconds: float) -> None:
    """Add this invocation's Tune wall time (Tuner.fit, from actor start to the last trial's end)
    to its run's entry in the study's meta: what `scripts/search_overhead.py` compares with the
    trials' own training time."""
    meta = study.meta()
    for run in meta["runs"]:
        if run["name"] == run_name:
            run["tune_wall_s"] = round(run.get("tune_wall_s", 0.0) + seconds, 3)
    study.write_meta(meta)


FINISHED_FLAG = ".autofl_finished"  # written in a Tune experiment's folder once all its trials ran


def _last_run_dir(study: Study) -> str | None:
    """Where the study's last main run (not a --join driver's) keeps its Tune experiment."""
    runs = [r for r in study.meta()["runs"] if not r["name"].startswith("join-")]
    return experiment_location(study, runs[-1]["name"]) if runs else None


def experiment_location(study: Study, run_name: str) -> str:
    return f"{study.tune_root().rstrip('/')}/{run_name}"


def _filesystem(location: str):
    """(pyarrow filesystem, path) for a folder or a URI such as s3://bucket/prefix or file:///x."""
    import pyarrow.fs

    if "://" in location:
        return pyarrow.fs.FileSystem.from_uri(location)
    return pyarrow.fs.LocalFileSystem(), location


def _flag_exists(location: str) -> bool:
    import pyarrow.fs

    fs, path = _filesystem(location)
    return fs.get_file_info(f"{path}/{FINISHED_FLAG}").type != pyarrow.fs.FileType.NotFound


def interrupted_run(study: Study) -> str | None:
    """The last Tune experiment of the study if it did not finish all its trials and Tune can restore it."""
    from ray import tune

    location = _last_run_dir(study)
    if location is None or _flag_exists(location) or not tune.Tuner.can_restore(location):
        return None
    return location


def mark_finished(study: Study) -> None:
    location = _last_run_dir(study)
    if location is not None:
        fs, path = _filesystem(location)
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{FINISHED_FLAG}"):
            pass


def fail_orphans(study: Study) -> int:
    """Optuna trials left RUNNING by a killed driver that no Tune experiment will finish: mark them FAIL."""
    from optuna.trial import TrialState

    from autofl.search.searcher import fail_interrupted

    ot = study.load_optuna()
    if ot is None:
        return 0
    # only this study's main runs: a --join driver may be running its trials right now
    orphans = [t for t in ot.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
               if not str(t.user_attrs.get("tune_run", "")).startswith("join-")]
    for t in orphans:
        fail_interrupted(ot, t)
    return len(orphans)


def join(study: Study, address: str | None) -> None:
    """Another driver on a study whose storage is shared (PostgreSQL): trials until the study's
    requested total is reached, counting every driver's."""
    run_experiment(study, study.meta().get("trials_requested") or study.space().trials, address, join=True)


def search(study: Study, trials: int | None, address: str | None, resume: bool) -> None:
    """New study: run its trials. Resume: finish the interrupted experiment, then any trials
    that never started; with `trials` on a finished study: add that many."""
    if resume and not study.meta()["runs"]:  # issue 18: a start that failed before its first run
        resume, trials = False, trials or study.space().trials  # (e.g. Ray did not start) runs the study now
    if not resume:
        run_experiment(study, trials or study.space().trials, address)
        mark_finished(study)
        return
    restore = interrupted_run(study)
    if restore is not None:
        run_experiment(study, 0, address, restore=restore)
        mark_finished(study)
        fail_orphans(study)
    else:  # killed before Tune saved anything: start over with what is missing
        last = _last_run_dir(study)
        if last is not None and not _flag_exists(last):
            meta = study.meta()
            fail_orphans(study)
            done = sum(1 for r in trial_rows(study)  # orphans just failed above are replaced, not counted
                       if r["state"] in FINISHED and not r["user_attrs"].get("interrupted"))
            missing = meta["trials_requested"] - done
            meta["trials_requested"] -= missing
            study.write_meta(meta)
            if missing > 0:
                run_experiment(study, missing, address)
                mark_finished(study)
    if trials:
        run_experiment(study, trials, address)
        mark_finished(study)

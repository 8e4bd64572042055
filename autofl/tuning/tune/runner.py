"""Which Tune experiments a study command runs: the resume state machine.

A new study runs its trials as `run-1`. `--resume` restores the last interrupted experiment with
Tune's own restore (searcher state, finished trials and trial checkpoints included), or, when the
driver was killed before Tune saved anything, starts over with the trials still missing; adding
trials to a finished study starts a new experiment on the same Optuna study, so the sampler sees
every earlier trial. A `--join` driver runs its own experiment on a shared (PostgreSQL) study.
Each experiment's folder gets a flag file once all its trials ran.

One experiment is run by autofl/tuning/tune/experiment.py; trial states are the ledger's
(autofl/tuning/store/ledger.py).
"""

from __future__ import annotations

import contextlib

from autofl.tuning.store.ledger import FINISHED_STATES, Ledger, counted
from autofl.tuning.store.study import StudyFolder, read_record
from autofl.tuning.store.write_failure import WriteFailed, failed_write
from autofl.tuning.tune.experiment import RUN_LAYOUT, StudyIncomplete, budget_spent, run_experiment

FINISHED_FLAG = ".autofl_finished"  # written in a Tune experiment's folder once all its trials ran


def _last_run(study: StudyFolder) -> dict | None:
    """The record of the study's last main run (not a --join driver's)."""
    runs = [r for r in read_record(study)["runs"] if not r["name"].startswith("join-")]
    return runs[-1] if runs else None


def _last_run_dir(study: StudyFolder) -> str | None:
    """Where the study's last main run keeps its Tune experiment."""
    run = _last_run(study)
    return experiment_location(study, run["name"]) if run is not None else None


def experiment_location(study: StudyFolder, run_name: str) -> str:
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


def interrupted_run(study: StudyFolder) -> str | None:
    """The last Tune experiment of the study if it did not finish all its trials and Tune can restore
    it. A run recorded by an autofl whose modules Tune's saved experiment names no longer (before
    RUN_LAYOUT) is not restored: as a moved study's, its missing trials then run as a new experiment
    (what its killed driver left is adopted and trained again, same numbers and params)."""
    from ray import tune

    run = _last_run(study)
    if run is None or run.get("layout") != RUN_LAYOUT:
        return None
    location = _last_run_dir(study)
    if location is None or _flag_exists(location) or not tune.Tuner.can_restore(location):
        return None
    return location


def mark_finished(study: StudyFolder) -> None:
    location = _last_run_dir(study)
    if location is not None:
        fs, path = _filesystem(location)
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{FINISHED_FLAG}"):
            pass


def fail_orphans(study: StudyFolder) -> int:
    """Trials left open by a killed main driver that no Tune experiment will finish: the ledger
    records them interrupted."""
    return Ledger(study.root).fail_orphans()


def join(study: StudyFolder, address: str | None) -> None:
    """Another driver on a study whose storage is shared (PostgreSQL): trials until the study's
    requested total is reached, counting every driver's."""
    run_experiment(study, read_record(study)["trials_requested"] or study.space().trials, address, join=True)


def run_or_resume(study: StudyFolder, trials: int | None, address: str | None, resume: bool) -> None:
    """New study: run its trials. Resume: finish the interrupted experiment, then any trials
    that never started; with `trials` on a finished study: add that many."""
    if resume and not read_record(study)["runs"]:  # issue 18: a start that failed before its first run
        resume, trials = False, trials or study.space().trials  # (e.g. Ray did not start) runs the study now
    if not resume:
        run_experiment(study, trials or study.space().trials, address)
        mark_finished(study)
        return
    restore = interrupted_run(study) if not moved(study) else None
    if restore is not None:
        # trials Tune's snapshot no longer runs (their driver died mid-write) are released and
        # trained again by top_up, below
        with contextlib.suppress(StudyIncomplete):
            run_experiment(study, 0, address, restore=restore)
        mark_finished(study)
    top_up(study, address)  # killed before Tune saved anything, or trials no experiment finished
    if trials:
        run_experiment(study, trials, address)
        mark_finished(study)


def moved(study: StudyFolder) -> bool:
    """Whether the study's folder was copied or moved since its last run: Tune's saved experiment
    (tuner.pkl, its trials' folders) names the old folder, and a restore wrote new trials' checkpoints
    there (issue 42). Such a study is not restored: its missing trials run as a new experiment in
    its own folder (what a killed driver left is adopted and trained again, same numbers and params)."""
    recorded = read_record(study)["root"]
    return recorded is not None and recorded != str(study.root.resolve())


def top_up(study: StudyFolder, address: str | None) -> None:
    """Run what no experiment finished, unless a budget ended the study: the trials a killed
    driver left (released, then adopted by the new run's first asks: same numbers and params) and
    those never started (placeholders are replaced, not counted)."""
    ledger = Ledger(study.root)
    ledger.release_orphans()
    record = ledger.record()
    main_runs = [r["name"] for r in record["runs"] if not r["name"].startswith("join-")]
    if main_runs and budget_spent(study, study.space(), ledger, main_runs[-1]):
        ledger.fail_orphans()  # no run of this study will train them
        return
    done = sum(1 for t in ledger.trials(FINISHED_STATES) if counted(t))
    missing = record["trials_requested"] - done
    if missing > 0:  # the new run trains them; the study's total stays what it was
        run_experiment(study, missing, address, top_up=True)
        mark_finished(study)


def run_study(
    study: StudyFolder,
    trials: int | None = None,
    address: str | None = None,
    resume: bool = False,
    join_shared: bool = False,
) -> None:
    """The one entry point (CLI and Python API): run a new study, resume or extend one
    (`resume`, `trials` to add), or add a driver to a shared one (`join_shared`). Ray must be
    started (autofl.tuning.tune.ray_start.start_ray) or `address` given."""
    try:
        if join_shared:
            join(study, address)
        else:
            run_or_resume(study, trials, address, resume=resume)
    except Exception as err:
        reason = failed_write(err)
        if reason is None:
            raise
        raise WriteFailed.of(study.name, reason) from None

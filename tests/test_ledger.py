"""The study ledger decides every trial state: the outcome rule on fixed results, what status shows,
closing a trial once (a second close or a late report changes nothing), a budget's cut, orphans,
and the Tune id <-> Optuna number map."""

from __future__ import annotations

import pickle

import optuna
import pytest

from autofl.tuning.store.ledger import INTERRUPTED, Ledger, outcome, shown_state
from conftest import STORAGE_KINDS, new_ledger


@pytest.fixture(params=STORAGE_KINDS)
def storage(request) -> str:
    return request.param



def _ask(ledger: Ledger, tune_id: str, run: str = "run-1", known: set[str] | None = None, budget: int = 10):
    return ledger.ask(run, tune_id, known or set(), budget, optuna.samplers.RandomSampler(seed=0),
                      lambda trial: trial.suggest_float("x", 0.0, 1.0))


@pytest.mark.parametrize("result,error,expected", [
    ({"round": 4, "acc": 0.8}, False, ("COMPLETE", [0.8])),
    ({"round": 2, "acc": 0.8}, False, ("PRUNED", None)),  # stopped before max_t
    ({"round": 4, "acc": float("nan")}, False, ("FAIL", None)),  # no finite value
    ({"round": 4}, False, ("FAIL", None)),
    ({"round": 4, "acc": 0.8, "diverged": "diverged at round 4"}, False, ("FAIL", None)),
    ({"round": 4, "acc": 0.8}, True, ("FAIL", None)),  # the trainable raised
    (None, True, ("FAIL", None)),
])
def test_outcome_rule(result, error, expected):
    assert outcome(result, error, ["acc"], max_t=4) == expected


def test_outcome_of_a_multi_objective_trial_needs_every_value():
    assert outcome({"round": 4, "a": 0.8, "b": 0.1}, False, ["a", "b"], 4) == ("COMPLETE", [0.8, 0.1])
    assert outcome({"round": 4, "a": 0.8}, False, ["a", "b"], 4) == ("FAIL", None)


def test_shown_state_marks_what_a_killed_driver_left_interrupted():
    assert shown_state("FAIL", {"interrupted": True}, live_driver=True) == INTERRUPTED
    assert shown_state("FAIL", {}, live_driver=False) == "FAIL"
    assert shown_state("RUNNING", {"tune_run": "run-1"}, live_driver=False) == INTERRUPTED
    assert shown_state("RUNNING", {"tune_run": "run-1"}, live_driver=True) == "RUNNING"
    assert shown_state("RUNNING", {"tune_run": "join-h-1-2"}, live_driver=False) == "RUNNING"  # its own driver
    assert shown_state("COMPLETE", {}, live_driver=False) == "COMPLETE"


def test_a_trial_is_closed_once_and_mapped_both_ways(tmp_path, storage):
    ledger = new_ledger(tmp_path, storage)
    number, params = _ask(ledger, "t1")
    assert set(params) == {"x"} and ledger.number_of("t1") == number and ledger.state_of("t1") == "RUNNING"
    assert ledger.report(number, 0.5, 1) and ledger.report(number, 0.6, 2)
    assert ledger.close(number, {"round": 3, "acc": 0.7, "personal_test_acc": 0.65}, False, ["acc"], 4) == "PRUNED"
    # a second close (a restored driver) and a late report change nothing
    assert ledger.close(number, {"round": 4, "acc": 0.9}, False, ["acc"], 4) == "PRUNED"
    assert ledger.report(number, 0.9, 4) is False
    (trial,) = pickle.loads(pickle.dumps(ledger)).trials()  # a pickled ledger reopens the storage
    assert trial.state.name == "PRUNED" and trial.intermediate_values == {1: 0.5, 2: 0.6, 3: 0.7}
    assert trial.user_attrs["personal_test_acc"] == 0.65 and ledger.finished_in_run("run-1") == {"t1"}
    assert b"optuna.db" not in pickle.dumps(ledger)


def test_a_rounds_report_and_a_member_assignment_write_without_asking_the_sampler(tmp_path, storage):
    """A driver records every round of every trial (a population's members: one result, several
    reports): each is one storage write. Making Optuna's Trial handle calls the sampler's `before_trial`,
    where autofl's sampler reads every trial of the study (a profile of a 40-trial population study,
    2026-12-07: 20 ms a report, a third of the driver's time per result), so the ledger writes through
    the storage."""

    class CountingSampler(optuna.samplers.RandomSampler):
        calls = 0

        def before_trial(self, study, trial):
            CountingSampler.calls += 1
            return super().before_trial(study, trial)

    ledger = new_ledger(tmp_path, storage)
    number, _ = _ask(ledger, "t1")
    ledger.study(sampler=CountingSampler(seed=0))  # what the searcher's ledger holds
    before = CountingSampler.calls
    assert ledger.report(number, 0.5, 1) and ledger.report(number, 0.5, 1) and ledger.report(number, 0.6, 2)
    ledger.assign_member(number, {"x": 0.1}, joins_at=3)
    ledger.note_left(number, 4)
    assert CountingSampler.calls == before
    (trial,) = ledger.trials()
    assert trial.intermediate_values == {1: 0.5, 2: 0.6} and trial.user_attrs["left_cohort_at"] == 4
    assert ledger.close(number, {"round": 2, "acc": 0.6}, False, ["acc"], 4) == "PRUNED"
    assert ledger.report(number, 0.7, 3) is False  # a finished trial takes no further round


def test_budget_cut_orphans_and_the_run_budget(tmp_path, storage):
    ledger = new_ledger(tmp_path, storage)
    trained, _ = _ask(ledger, "trained")
    ledger.report(trained, 0.4, 1)
    never, _ = _ask(ledger, "never")
    joined, _ = _ask(ledger, "joined", run="join-h-1-2")
    assert ledger.settle_run("run-1") == 2  # a budget ended run-1
    states = {t.user_attrs["tune_trial_id"]: (t.state.name, t.user_attrs.get("interrupted")) for t in ledger.trials()}
    assert states == {"trained": ("PRUNED", None), "never": ("FAIL", True), "joined": ("RUNNING", None)}
    assert ledger.fail_orphans() == 0  # a --join driver's trial is its own driver's to finish
    # the run's budget counts what its searcher handed out, not interrupted trials
    assert _ask(ledger, "a", known={"trained", "never"}, budget=2) is not None
    assert _ask(ledger, "b", known={"trained", "never", "a"}, budget=2) is None


def test_tunes_last_results_complete_what_a_budget_cut_left_open(tmp_path, storage):
    """Tune stops the live trials when a budget stopper fires, without telling the searcher; the
    last result it held of each is recorded, and closes the trial as the outcome rule says."""
    ledger = new_ledger(tmp_path, storage)
    full, _ = _ask(ledger, "full")
    ledger.report(full, 0.5, 3)  # round 4, its last, was still held by Tune
    cut, _ = _ask(ledger, "cut")
    ledger.report(cut, 0.2, 1)
    never, _ = _ask(ledger, "never")
    other, _ = _ask(ledger, "other", run="run-2")
    last = {"full": {"round": 4, "acc": 0.7, "personal_test_acc": 0.66}, "cut": {"round": 2, "acc": 0.3},
            "other": {"round": 4, "acc": 0.9}}
    assert ledger.record_last_results("run-1", last, "acc") == 2
    assert ledger.record_last_results("run-1", last, "acc") == 0  # already recorded
    assert sum(ledger.rounds_used().values()) == 6  # the other run's trial is not this run's
    assert ledger.close_open("run-1", last, ["acc"], max_t=4) == 2
    assert ledger.settle_run("run-1") == 1  # the one never started
    by_id = {t.user_attrs["tune_trial_id"]: t for t in ledger.trials()}
    assert by_id["full"].state.name == "COMPLETE" and by_id["full"].value == 0.7
    assert by_id["full"].user_attrs["personal_test_acc"] == 0.66
    assert by_id["cut"].state.name == "PRUNED" and by_id["cut"].intermediate_values == {1: 0.2, 2: 0.3}
    assert by_id["never"].user_attrs.get("interrupted") and by_id["other"].state.name == "RUNNING"


def test_a_killed_drivers_trial_is_adopted_by_the_next_ask_not_replaced(tmp_path):
    """Issue 42: a trial a killed driver left open is trained again as the same Optuna trial (same
    number, same params, a new Tune id) by the resumed driver's next ask, so no INTERRUPTED
    placeholder is added and the trial numbers stay those of an uninterrupted run. A trial killed
    before its params were whole (untagged: CI's kill stress left two such placeholders) is adopted
    too: the adopting ask sets its params."""
    ledger = new_ledger(tmp_path)
    done, _ = _ask(ledger, "done")
    ledger.close(done, {"round": 4, "acc": 0.5}, False, ["acc"], 4)
    killed, params = _ask(ledger, "killed")
    assert ledger.report(killed, 0.3, 1)
    untagged = ledger.study().ask()  # killed between Optuna's ask and the tag
    assert ledger.release_orphans() == 2
    by_number = {t.number: t for t in ledger.trials()}
    assert by_number[killed].state.name == "RUNNING" and by_number[killed].user_attrs["orphaned"]
    assert shown_state("RUNNING", by_number[killed].user_attrs, live_driver=True) == INTERRUPTED
    assert by_number[untagged.number].state.name == "RUNNING" and by_number[untagged.number].user_attrs["orphaned"]
    assert not by_number[untagged.number].user_attrs.get("interrupted")  # no placeholder
    assert ledger.release_orphans() == 0  # released once

    again = _ask(ledger, "resumed", run="run-2")
    assert again == (killed, params)  # the same trial, trained again
    trial = ledger.trials()[killed]
    assert trial.user_attrs["tune_trial_id"] == "resumed" and trial.user_attrs["tune_run"] == "run-2"
    assert trial.user_attrs["earlier_tune_trial_ids"] == ["killed"] and not trial.user_attrs["orphaned"]
    assert ledger.number_of("resumed") == killed
    assert ledger.report(killed, 0.3, 1) and ledger.report(killed, 0.4, 2)  # its first round again: kept once
    assert ledger.trials()[killed].intermediate_values == {1: 0.3, 2: 0.4}
    number, adopted = _ask(ledger, "untagged", run="run-2")
    assert number == untagged.number and set(adopted) == {"x"}  # its param set by the adopting ask
    trial = ledger.trials()[untagged.number]
    assert trial.params == adopted and trial.user_attrs["earlier_tune_trial_ids"] == []
    fresh, _ = _ask(ledger, "next", run="run-2")
    assert fresh == untagged.number + 1 and len(ledger.trials()) == 4  # a new trial only once no orphan is left


def test_an_enqueued_start_point_is_not_released(tmp_path):
    """A WAITING trial (an enqueued start point) is no orphan: the next ask takes it, as an
    uninterrupted run's would."""
    ledger = new_ledger(tmp_path)
    ledger.study().enqueue_trial({"x": 0.25})
    assert ledger.release_orphans() == 0 and ledger.release_unknown_orphans("run-1", set()) == 0
    number, params = _ask(ledger, "first")
    assert params == {"x": 0.25} and not ledger.trials()[number].user_attrs.get("orphaned")


def test_a_restored_searcher_releases_the_trials_its_snapshot_missed(tmp_path):
    ledger = new_ledger(tmp_path)
    known, _ = _ask(ledger, "known")
    missed, _ = _ask(ledger, "missed")
    other, _ = _ask(ledger, "other", run="run-2")
    assert ledger.release_unknown_orphans("run-1", {"known"}) == 1
    attrs = {t.number: t.user_attrs for t in ledger.trials()}
    assert attrs[missed].get("orphaned") and not attrs[known].get("orphaned") and not attrs[other].get("orphaned")
    assert _ask(ledger, "again", known={"known"}, budget=2)[0] == missed


def test_a_run_that_ends_open_without_a_signal_is_not_reported_interrupted(tmp_path):
    """Issue 42: exit 130 'interrupted' came without any signal (after a full disk); only a signal
    is an interruption: trials left open otherwise are StudyIncomplete (exit 1), resumable."""
    from autofl.tuning.store.study import StudyFolder
    from autofl.tuning.tune.experiment import StudyIncomplete, StudyInterrupted, settle_run

    ledger = new_ledger(tmp_path)
    _ask(ledger, "open")
    study = StudyFolder(tmp_path / "s")
    with pytest.raises(StudyIncomplete) as err:
        settle_run(study, study.space(), ledger, "run-1", interrupted=False)
    assert err.value.exit_code == 1 and "1 trial(s) unfinished" in str(err.value)
    with pytest.raises(StudyInterrupted):
        settle_run(study, study.space(), ledger, "run-1", interrupted=True)


def test_the_studys_record_is_the_ledgers_and_study_json_keeps_what_was_fixed_at_creation(tmp_path, storage):
    """Runs, the requested total and the run's folder change as a study runs: the ledger keeps them in
    the storage (issue 38: four functions rewrote study.json, and the requested total lived in two
    places). A --join driver's run shares the requested total; wall time adds up per run."""
    import json

    ledger = new_ledger(tmp_path, storage)
    meta = tmp_path / "s" / "study.json"
    meta.write_text(json.dumps({"default_sampler": {"kind": "random", "skip_repeats": True}}))
    assert ledger.record() == {"runs": [], "trials_requested": 0, "root": None}
    ledger.add_run("run-1", 4, 2, join=False)
    ledger.add_run("join-h-1-2", 4, 2, join=True)
    ledger.add_wall("run-1", 1.5)
    ledger.add_wall("run-1", 2.0)
    record = Ledger(tmp_path / "s").record()  # as another process reads it
    assert record == {"runs": [{"name": "run-1", "trials": 4, "layout": 2, "tune_wall_s": 3.5},
                               {"name": "join-h-1-2", "trials": 4, "layout": 2}],
                      "trials_requested": 4, "root": str((tmp_path / "s").resolve())}
    assert ledger.requested() == 4  # what every driver counts against
    ledger.add_run("run-2", 3, 2, join=False, top_up=True)  # a resume's top-up: the total never dips
    assert Ledger(tmp_path / "s").record()["trials_requested"] == 4
    assert json.loads(meta.read_text()) == {"default_sampler": {"kind": "random", "skip_repeats": True}}


def test_an_older_studys_record_moves_from_study_json_into_the_ledger_at_its_next_run(tmp_path, storage):
    """A study made before the record moved kept runs, trials_requested and root in study.json: they
    are read from there until the next run, which moves them, so there is one record again."""
    import json

    ledger = new_ledger(tmp_path, storage)
    meta = tmp_path / "s" / "study.json"
    old_runs = [{"name": "run-1", "trials": 3, "layout": 2, "tune_wall_s": 7.0}]
    meta.write_text(json.dumps({"runs": old_runs, "trials_requested": 3, "root": "/old/s", "storage_path": "/x"}))
    assert ledger.record() == {"runs": old_runs, "trials_requested": 3, "root": "/old/s"}
    ledger.add_run("run-2", 2, 2, join=False)
    assert ledger.record() == {"runs": [*old_runs, {"name": "run-2", "trials": 2, "layout": 2}],
                               "trials_requested": 5, "root": str((tmp_path / "s").resolve())}
    assert json.loads(meta.read_text()) == {"storage_path": "/x"}

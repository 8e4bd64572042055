"""How trials land in Optuna: by round, PRUNED/COMPLETE/FAIL, and across a killed driver's resume
(a driver killed between Optuna's write and Tune's snapshot must not make a resume fail or rerun)."""

import pickle
from pathlib import Path

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from autofl.tuning.store.ledger import Ledger
from autofl.tuning.tune.searcher import StudySearcher
from autofl.tuning.tune.stopper import AlreadyRecordedStopper


def define_x(trial) -> None:
    """The test's space: one float `x` (module level: the searcher pickles it)."""
    trial.suggest_float("x", 0.0, 1.0)


def study_url(tmp_path: Path) -> str:
    """A study folder `s` (its space file names it) and the URL of its default SQLite storage."""
    root = tmp_path / "s"
    root.mkdir(exist_ok=True)
    (root / "space.yaml").write_text("study: s\n")
    return f"sqlite:///{root / 'optuna.db'}"


def make_searcher(url: str, budget: int = 6) -> StudySearcher:
    root = Path(url.removeprefix("sqlite:///")).parent
    return StudySearcher(Ledger(root), define_x, optuna.samplers.TPESampler(seed=0), metric="personal_val_acc",
                         mode="max", max_t=4, run_name="run-1", budget=budget)


def test_stopped_early_is_pruned_full_length_is_complete_errors_fail(tmp_path):
    url = study_url(tmp_path)
    searcher = make_searcher(url)
    for tid in ("stopped", "full", "broken"):
        assert searcher.suggest(tid) is not None
    for rnd in (1, 2):
        searcher.on_trial_result("stopped", {"personal_val_acc": 0.1 * rnd, "round": rnd})
    searcher.on_trial_complete("stopped", {"personal_val_acc": 0.2, "round": 2, "personal_test_acc": 0.3})
    for rnd in (1, 2, 3):
        searcher.on_trial_result("full", {"personal_val_acc": 0.2 * rnd, "round": rnd})
    searcher.on_trial_complete("full", {"personal_val_acc": 0.8, "round": 4})  # Tune's last result comes here
    searcher.on_trial_complete("broken", None, error=True)

    stopped, full, broken = optuna.load_study(study_name="s", storage=url).get_trials()
    assert stopped.state == TrialState.PRUNED and stopped.value == 0.2  # Optuna: a pruned trial's last value
    assert stopped.intermediate_values == {1: 0.1, 2: 0.2} and stopped.user_attrs["personal_test_acc"] == 0.3
    assert full.state == TrialState.COMPLETE and full.value == 0.8
    assert full.intermediate_values == {1: 0.2, 2: 0.4, 3: 0.6000000000000001, 4: 0.8}
    assert broken.state == TrialState.FAIL


def test_searcher_ignores_results_of_a_trial_the_study_already_finished(tmp_path):
    url = study_url(tmp_path)
    searcher = make_searcher(url)
    assert searcher.suggest("t1") is not None
    searcher.on_trial_result("t1", {"personal_val_acc": 0.5, "round": 1})
    killed_driver = optuna.load_study(study_name="s", storage=url)  # recorded it before dying
    killed_driver.tell(0, state=TrialState.PRUNED)

    searcher.on_trial_result("t1", {"personal_val_acc": 0.7, "round": 2})  # the restored trial trains on
    searcher.on_trial_complete("t1", {"personal_val_acc": 0.7, "round": 2})

    (trial,) = optuna.load_study(study_name="s", storage=url).get_trials()
    assert trial.state == TrialState.PRUNED and trial.intermediate_values == {1: 0.5}
    assert trial.user_attrs["tune_trial_id"] == "t1" and trial.user_attrs["tune_run"] == "run-1"


def test_searcher_budget_counts_finished_trials_its_restored_state_never_saw(tmp_path):
    url = study_url(tmp_path)
    snapshot = make_searcher(url, budget=4)
    assert snapshot.suggest("a") is not None
    snapshot.save(str(tmp_path / "searcher.json"))  # what Tune's last snapshot holds
    assert snapshot.suggest("b") is not None and snapshot.suggest("c") is not None  # after the snapshot
    study = optuna.load_study(study_name="s", storage=url)
    study.tell(1, 0.8)  # "b" finished before the kill, "c" was still running (an orphan to replace)

    restored = make_searcher(url, budget=4)
    restored.restore(str(tmp_path / "searcher.json"))
    assert restored.suggest("d") is not None and restored.suggest("e") is not None  # a, b, d, e
    assert restored.suggest("f") == Searcher.FINISHED


def test_stopper_stops_only_trials_already_finished_in_the_study_and_rechecks_after_restore(tmp_path):
    url = study_url(tmp_path)
    study = optuna.create_study(study_name="s", storage=url)
    for tune_id, run in (("done", "run-2"), ("running", "run-2"), ("other_run", "run-1")):
        trial = study.ask()
        trial.set_user_attr("tune_trial_id", tune_id)
        trial.set_user_attr("tune_run", run)
    study.tell(0, 0.9)
    study.tell(2, 0.5)

    stopper = AlreadyRecordedStopper(Ledger(tmp_path / "s"), "run-2")
    assert stopper("done", {"round": 3}) is True
    assert stopper("other_run", {"round": 1}) is False  # an id of another experiment is not this one
    assert stopper("running", {"round": 3}) is False
    study.tell(1, 0.8)  # finished by this driver: later results are not looked up again
    assert stopper("running", {"round": 4}) is False
    assert stopper.stop_all() is False

    restored = pickle.loads(pickle.dumps(stopper))  # a resumed driver looks every trial up once more
    assert restored("running", {"round": 4}) is True


def test_resume_without_a_tune_snapshot_runs_the_missing_trials_and_adopts_the_orphan(tmp_path, monkeypatch):
    """Killed before Tune saved anything: the trials still missing are run anew; a trial the dead
    driver left RUNNING (here untagged: killed before its params were set) is not counted as done,
    and is released for the new run's first ask to adopt (issue 42: no placeholder)."""
    import yaml

    from autofl.tuning.tune import runner
    from autofl.tuning.store.study import create_study
    from autofl.tuning.strategy.space import load_space

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"study": "s", "trials": 4}))
    study = create_study(tmp_path / "home", path, load_space(path), None)
    study.write_meta({"runs": [{"name": "run-1", "trials": 4}], "trials_requested": 4})
    ot = optuna.create_study(study_name="s", storage=study.storage_url())
    ot.tell(ot.ask(), 0.9)  # finished before the kill
    ot.ask()  # left RUNNING by the killed driver
    started = []
    monkeypatch.setattr(runner, "run_experiment",
                        lambda st, trials, address, restore=None, top_up=False: started.append((trials, top_up)))

    runner.run_or_resume(study, None, None, resume=True)

    assert started == [(3, True)]  # a top-up: the study's total stays 4 (it never dips, for a kill now)
    from autofl.tuning.store.ledger import Ledger

    assert Ledger(study.root).requested() == 4
    states = [(t.state, t.user_attrs.get("interrupted"), t.user_attrs.get("orphaned")) for t in optuna.load_study(
        study_name="s", storage=study.storage_url()).get_trials()]
    assert states == [(TrialState.COMPLETE, None, None), (TrialState.RUNNING, None, True)]


def test_pickled_searcher_and_stopper_carry_the_study_folder_not_the_storage(tmp_path):
    """Tune pickles both into tuner.pkl and its state files: a storage URL there (which may hold a
    password from AUTOFL_STORAGE) would be written in clear; they reopen it from the study instead."""
    url = study_url(tmp_path)
    searcher = make_searcher(url)
    assert searcher.suggest("a") is not None
    blob = pickle.dumps(searcher)
    assert b"optuna.db" not in blob and b"sqlite" not in blob
    restored = pickle.loads(blob)
    restored.on_trial_complete("a", {"personal_val_acc": 0.5, "round": 4})
    (trial,) = optuna.load_study(study_name="s", storage=url).get_trials()
    assert trial.state == TrialState.COMPLETE and trial.value == 0.5
    stopper = pickle.dumps(AlreadyRecordedStopper(Ledger(tmp_path / "s"), "run-1"))
    assert b"optuna.db" not in stopper and b"sqlite" not in stopper


def test_searcher_holds_back_suggestions_beyond_its_concurrency_limit(tmp_path):
    """Tune's max_concurrent_trials is applied by the searcher itself (it tells Tune so): Tune then
    keeps that many trials pending, so every slot's worker starts at once."""
    searcher = make_searcher(study_url(tmp_path))
    assert searcher.set_max_concurrency(2) is True
    assert searcher.suggest("a") is not None and searcher.suggest("b") is not None
    assert searcher.suggest("c") is None  # two in flight: asked again later
    searcher.on_trial_complete("a", {"personal_val_acc": 0.5, "round": 4})
    assert searcher.suggest("c") is not None


def test_concurrent_slots_count_what_the_cluster_holds():
    from autofl.tuning.tune.ray_start import concurrent_slots
    from autofl.tuning.strategy.space import SearchSpace

    def slots(resources, cpu, gpu=0.0):
        return concurrent_slots(resources, SearchSpace(study="s", resources={"cpu": cpu, "gpu": gpu}))

    assert slots({"CPU": 2.0}, 1) == 2 and slots({"CPU": 2.0}, 2) == 1 and slots({"CPU": 2.0}, 0.5) == 4
    assert slots({"CPU": 16.0, "GPU": 1.0}, 1, gpu=0.25) == 4  # four trials share the card
    assert slots({"CPU": 1.0}, 4) == 1  # never below one


def test_checkpoints_closer_than_tunes_snapshot_are_all_kept(monkeypatch):
    """A resumed run restores the checkpoint Tune's last snapshot (every TUNE_GLOBAL_CHECKPOINT_S)
    names; frequent checkpoints must not delete it before the next snapshot."""
    from autofl.tuning.tune.checkpoints import checkpoints_to_keep
    from autofl.tuning.strategy.space import SearchSpace

    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "2")
    assert checkpoints_to_keep(SearchSpace(study="s", checkpoint_every_s=0)) is None
    assert checkpoints_to_keep(SearchSpace(study="s", checkpoint_every_s=3.9)) is None
    assert checkpoints_to_keep(SearchSpace(study="s", checkpoint_every_s=4)) == 2
    assert checkpoints_to_keep(SearchSpace(study="s")) == 2  # the default, 30 s

"""The Tune trainable without a Ray cluster: round results, NaN handling, checkpoint continuation."""

import re

import pytest

from autofl.tuning.tune.trainable import FLTrainable

BASE = {"data": {"num_clients": 4}, "fl": {"rounds": 4}, "method": {"name": "fdcl"}}


def trainable(config: dict, checkpoint_every_s: float = 0.0) -> FLTrainable:
    t = FLTrainable.__new__(FLTrainable)  # what tune.with_parameters hands to setup, minus the cluster
    t.setup(config, base=BASE, threads=1, checkpoint_every_s=checkpoint_every_s)
    return t


def test_each_step_reports_one_evaluated_round_and_done_at_the_last():
    t = trainable({"method.mu": 0.5})
    results = [t.step() for _ in range(4)]
    assert [r["round"] for r in results] == [1, 2, 3, 4]
    assert [r["done"] for r in results] == [False, False, False, True]
    assert all(0.0 <= r["personal_val_acc"] <= 1.0 for r in results)
    assert t.sim.method.params.mu == 0.5


def test_nan_training_loss_ends_the_trial_with_its_reason_and_the_searcher_records_fail(tmp_path):
    t = trainable({"fl.lr": 1e4})
    result = t.step()
    while not result["done"]:
        result = t.step()
    assert result["diverged"] == f"diverged at round {result['round']}: train_loss is nan"

    import optuna

    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.tune.searcher import StudySearcher

    root = tmp_path / "s"
    root.mkdir()
    (root / "space.yaml").write_text("study: s\n")
    url = f"sqlite:///{root / 'optuna.db'}"
    searcher = StudySearcher(Ledger(root), lambda trial: trial.suggest_float("x", 0.0, 1.0),
                             optuna.samplers.TPESampler(seed=0), metric="personal_val_acc", mode="max", max_t=4,
                             run_name="run-1", budget=1)
    searcher.suggest("t")
    searcher.on_trial_complete("t", result)
    (trial,) = optuna.load_study(study_name="s", storage=url).get_trials()
    assert trial.state.name == "FAIL" and trial.user_attrs["fail_reason"] == result["diverged"]


def test_train_stops_with_one_line_naming_the_round_when_training_diverges(tmp_path, capsys):
    from autofl.cli import main

    code = main(["train", "--set", "fl.lr=1e4", "--set", "fl.rounds=6", "--set", "data.num_clients=4",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert re.search(r"training diverged at round \d+: train_loss is nan", err), err


def test_a_restored_trial_continues_exactly_where_its_checkpoint_left_off(tmp_path):
    straight = trainable({"method.mu": 0.5})
    expected = [straight.step() for _ in range(4)]

    first = trainable({"method.mu": 0.5})
    first.step(), first.step()
    first.save_checkpoint(str(tmp_path))
    restored = trainable({"method.mu": 0.5})
    restored.load_checkpoint(str(tmp_path))
    assert [restored.step(), restored.step()] == expected[2:]
    assert restored.step() == {**expected[3], "done": True}  # a finished trial restores as finished


def test_checkpoints_are_asked_for_once_enough_training_is_unsaved():
    every_round = trainable({}, checkpoint_every_s=0.0)
    assert [every_round.step()["should_checkpoint"] for _ in range(4)] == [True, True, True, False]  # end: Tune saves
    rarely = trainable({}, checkpoint_every_s=3600.0)
    assert not any(rarely.step()["should_checkpoint"] for _ in range(4))


def test_a_planted_pickle_in_a_checkpoint_is_refused(tmp_path):
    """Checkpoints hold tensors and plain containers only: loading never runs code from the file."""
    import pickle

    import autofl.tuning.tune.trainable as module

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("ran",))

    with open(tmp_path / module.STATE_FILE, "wb") as fh:
        pickle.dump({"round": 1, "evil": Payload()}, fh, protocol=2)
    t = trainable({})
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        t.load_checkpoint(str(tmp_path))
    assert not marker.exists()

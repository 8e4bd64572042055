"""The Tune trainable without a Ray cluster: round results, NaN handling, checkpoint continuation."""

import pytest

from autofl.tune.trainable import FLTrainable

BASE = {"data": {"num_clients": 4}, "fl": {"rounds": 4}, "method": {"name": "fdcl"}}


def trainable(config: dict) -> FLTrainable:
    t = FLTrainable.__new__(FLTrainable)  # what tune.with_parameters hands to setup, minus the cluster
    t.setup(config, base=BASE, threads=1)
    return t


def test_each_step_reports_one_evaluated_round_and_done_at_the_last():
    t = trainable({"method.mu": 0.5})
    results = [t.step() for _ in range(4)]
    assert [r["round"] for r in results] == [1, 2, 3, 4]
    assert [r["done"] for r in results] == [False, False, False, True]
    assert all(0.0 <= r["personal_val_acc"] <= 1.0 for r in results)
    assert t.sim.method.params.mu == 0.5


def test_nan_training_loss_errors_the_trial():
    t = trainable({"fl.lr": 1e8})
    with pytest.raises(FloatingPointError, match="training loss is nan"):
        for _ in range(4):
            t.step()


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

"""StudyASHA rebuilds ASHA's rung records from the study: after a resume, a new trial is judged
against the values earlier trials reached at each rung, and a trial already judged at a rung is
not judged there again."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import yaml
from optuna.distributions import FloatDistribution
from ray.tune.schedulers import TrialScheduler

from autofl.tuning.store.ledger import Ledger
from autofl.tuning.tune.scheduler import StudyASHA


def _study(tmp_path, curves: dict[str, dict[int, float]], mode: str = "max"):
    root = tmp_path / "s"
    root.mkdir()
    (root / "space.yaml").write_text(yaml.safe_dump({"study": "s"}))
    ot = optuna.create_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}",
                             direction="maximize" if mode == "max" else "minimize")
    for i, (tune_id, curve) in enumerate(curves.items()):
        attrs = {"tune_trial_id": tune_id} if tune_id else {}
        if tune_id == "gone":
            attrs["interrupted"] = True
        ot.add_trial(optuna.trial.create_trial(params={"x": 0.05 * (i + 1)}, distributions={"x": FloatDistribution(0, 1)},
                                               intermediate_values=curve, user_attrs=attrs,
                                               state=optuna.trial.TrialState.PRUNED))
    return root


def _asha(root, mode: str = "max") -> StudyASHA:
    asha = StudyASHA(Ledger(root), time_attr="round", max_t=8, grace_period=2, reduction_factor=2)
    asha.set_search_properties(metric="acc", mode=mode, config={})
    return asha


def _judge(asha: StudyASHA, trial_id: str, rnd: int, value: float) -> str:
    """Tune hands the scheduler a result (its public hook)."""
    return asha.on_trial_result(None, SimpleNamespace(trial_id=trial_id), {"round": rnd, "acc": value})


def test_rungs_hold_the_studys_values_at_each_milestone(tmp_path):
    root = _study(tmp_path, {"a": {1: 0.1, 2: 0.5, 3: 0.6, 4: 0.7}, "b": {1: 0.2, 2: 0.3}, "gone": {2: 0.99},
                             None: {2: 0.98}})
    asha = _asha(root)
    assert asha.seed_from_study() == 3 and asha.seed_from_study() == 0  # once per driver
    rungs = {int(m): r for m, r in asha.rungs.items()}
    assert rungs[2] == {"a": 0.5, "b": 0.3} and rungs[4] == {"a": 0.7}  # interrupted and untagged left out
    # a new trial at round 2 below the rung's cutoff (its median here) is stopped, above it continues
    assert _judge(asha, "new1", 2, 0.2) == TrialScheduler.STOP
    assert _judge(asha, "new2", 2, 0.6) == TrialScheduler.CONTINUE
    # a resumed trial already judged at a rung is not judged there again: `a` passed rung 2 (it reported
    # round 4 after it), so it goes on whatever it reports now
    assert _judge(asha, "a", 2, 0.0) == TrialScheduler.CONTINUE


def test_a_trial_stopped_at_its_last_rung_by_a_killed_driver_stays_stopped(tmp_path):
    """A driver killed after ASHA stopped a trial but before the trial ended leaves it with its value at
    the rung: the next driver stops it at its first result (an uninterrupted run never trains it on),
    and lets on a trial whose last rung let it continue."""
    root = _study(tmp_path, {"a": {1: 0.4, 2: 0.5}, "low": {1: 0.3, 2: 0.3}, "high": {1: 0.6, 2: 0.7}})
    asha = _asha(root)
    # `low` was judged at rung 2 against `a` (0.3 < 0.5: stopped); restored from its round-2 checkpoint
    assert _judge(asha, "low", 3, 0.9) == TrialScheduler.STOP
    # `high` passed rung 2 (0.7 beats the rung's other values) and trains on
    assert _judge(asha, "high", 3, 0.7) == TrialScheduler.CONTINUE
    assert _judge(asha, "high", 4, 0.7) == TrialScheduler.CONTINUE  # judged at rung 4 as usual


def test_minimized_objectives_are_recorded_and_judged_as_asha_does(tmp_path):
    root = _study(tmp_path, {"a": {2: 0.5}}, mode="min")
    asha = _asha(root, mode="min")
    asha.seed_from_study()
    assert {int(m): r for m, r in asha.rungs.items()}[2] == {"a": 0.5}  # in the objective's units
    assert _judge(asha, "worse", 2, 0.6) == TrialScheduler.STOP  # higher is worse when minimizing
    assert _judge(asha, "better", 2, 0.4) == TrialScheduler.CONTINUE


def test_a_restored_scheduler_seeds_again(tmp_path):
    import pickle

    root = _study(tmp_path, {"a": {2: 0.5}})
    asha = _asha(root)
    asha.seed_from_study()
    restored = pickle.loads(pickle.dumps(asha))
    assert restored.seed_from_study() == 1  # looks at the study again, without recording a value twice
    assert restored.seed_from_study() == 0 and {int(m): r for m, r in restored.rungs.items()}[2] == {"a": 0.5}


def test_hyperband_brackets_take_only_their_own_trials_from_the_study(tmp_path):
    curves = {f"t{i}": {1: 0.05 * i, 2: 0.05 * i + 0.01, 4: 0.05 * i + 0.02} for i in range(16)}
    root = _study(tmp_path, curves)
    hb = StudyASHA(Ledger(root), time_attr="round", max_t=8, grace_period=1, reduction_factor=2, brackets=2)
    hb.set_search_properties(metric="acc", mode="max", config={})
    brackets = hb.rungs_per_bracket
    assert [sorted(b) for b in brackets] == [[1, 2, 4, 8], [2, 4, 8]]
    for tid in curves:  # each trial sits in its own bracket only, at that bracket's first rung
        own = hb.bracket_of(tid)
        assert tid in brackets[own][min(brackets[own])]
        assert all(tid not in recorded for b, bracket in enumerate(brackets) if b != own
                   for recorded in bracket.values())
    assert {hb.bracket_of(tid) for tid in curves} == {0, 1}  # both brackets hold trials here

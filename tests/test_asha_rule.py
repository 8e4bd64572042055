"""autofl.tuning.strategy.asha is Ray Tune's ASHA rule: on random result streams it stops exactly the trials
Tune's AsyncHyperBandScheduler stops (driven through its public hooks), and the rungs rebuilt
from the trials' per-round values (what a resumed driver or the benchmark replay sees) equal
the rungs the live run built."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from autofl.tuning.strategy import asha


class Reference:
    """The scheduler's bookkeeping written with the pure functions only."""

    def __init__(self, grace: float, max_t: float, rf: float, mode: str):
        self.rungs = {m: {} for m in asha.milestones(grace, max_t, rf)}
        self.max_t, self.rf, self.mode = max_t, rf, mode

    def _record(self, tid: str, rnd: float, value: float) -> bool:
        judged = [m for m, rec in self.rungs.items() if tid in rec]
        milestone = asha.rung_to_judge(list(self.rungs), rnd, judged)
        if milestone is None:
            return False
        stop = asha.decide(list(self.rungs[milestone].values()), value, self.mode, self.rf)
        self.rungs[milestone][tid] = value
        return stop

    def result(self, tid: str, rnd: float, value: float) -> bool:
        if rnd >= self.max_t:
            return True
        return self._record(tid, rnd, value)

    def complete(self, tid: str, rnd: float, value: float) -> None:
        self._record(tid, rnd, value)


SETTINGS = [(1, 9, 3, "max", 1), (2, 8, 2, "min", 1), (1, 10, 2.5, "max", 1), (1, 16, 2, "max", 3)]


@pytest.mark.parametrize("grace,max_t,rf,mode,every", SETTINGS)
def test_decisions_and_rebuilt_rungs_match_tunes_asha(grace, max_t, rf, mode, every):
    rng = random.Random(7)
    tune_asha = AsyncHyperBandScheduler(time_attr="round", metric="acc", mode=mode, max_t=max_t,
                                        grace_period=grace, reduction_factor=rf)
    ref = Reference(grace, max_t, rf, mode)
    curves: dict[str, dict[int, float]] = {}
    finished: set[str] = set()
    live: dict[str, int] = {}
    stops = 0
    for step in range(400):
        if len(live) < 4 and len(curves) < 40:
            tid = f"t{len(curves)}"
            curves[tid], live[tid] = {}, 0
            tune_asha.on_trial_add(None, SimpleNamespace(trial_id=tid))
        tid = rng.choice(sorted(live))
        live[tid] += every
        rnd = live[tid]
        value = round(rng.random() + 0.02 * rnd, 3)
        curves[tid][rnd] = value
        trial = SimpleNamespace(trial_id=tid)
        theirs = tune_asha.on_trial_result(None, trial, {"round": rnd, "acc": value}) == TrialScheduler.STOP
        ours = ref.result(tid, rnd, value)
        assert ours == theirs, (step, tid, rnd)
        if ours:
            stops += 1
            tune_asha.on_trial_complete(None, trial, {"round": rnd, "acc": value})
            ref.complete(tid, rnd, value)
            finished.add(tid)
            del live[tid]
        if not live and len(curves) >= 40:
            break
    assert stops > 10  # the streams exercised both outcomes
    rebuilt = {m: {} for m in ref.rungs}
    for tid, curve in curves.items():
        for m, v in asha.recorded_values(curve, list(ref.rungs), max_t, tid in finished).items():
            rebuilt[m][tid] = v
    assert rebuilt == ref.rungs


def test_milestones_cutoff_and_decide_on_fixed_values():
    assert asha.milestones(2, 8, 2) == [2, 4, 8] and asha.milestones(1, 9, 3) == [1, 3, 9]
    values = [0.1, 0.2, 0.3, 0.4]
    assert asha.cutoff(values, "max", 2) == pytest.approx(float(np.percentile(values, 50)))  # 0.25
    assert asha.decide(values, 0.24, "max", 2) and not asha.decide(values, 0.26, "max", 2)
    assert asha.cutoff(values, "min", 2) == pytest.approx(0.25)
    assert asha.decide(values, 0.26, "min", 2) and not asha.decide(values, 0.24, "min", 2)
    assert not asha.decide([], 0.0, "max", 2) and asha.cutoff([], "max", 2) is None
    assert asha.rung_to_judge([2, 4, 8], 5, judged=[4]) == 2 and asha.rung_to_judge([2, 4, 8], 1, []) is None
    with pytest.raises(ValueError, match="mode"):
        asha.decide(values, 0.1, "maximize", 2)


def test_hyperband_brackets_have_tunes_rungs_and_a_stable_draw():
    tune_hb = AsyncHyperBandScheduler(time_attr="round", metric="acc", mode="max", max_t=27, grace_period=1,
                                      reduction_factor=3, brackets=3)
    # Tune's brackets (public: its debug string lists each bracket's rung rounds)
    listed = [[float(part.split(":")[0].split()[-1]) for part in line.removeprefix("Bracket: ").split(" | ")]
              for line in tune_hb.debug_string().splitlines()[1:]]
    ours = [sorted(asha.milestones(1, 27, 3, s), reverse=True) for s in range(3)]
    assert listed == ours == [[27, 9, 3, 1], [27, 9, 3], [27, 9]]
    weights = asha.bracket_weights(1, 27, 3, 3)
    assert weights == pytest.approx([np.e ** (n - 4) / sum(np.e ** (m - 4) for m in (4, 3, 2)) for n in (4, 3, 2)])
    draws = [asha.bracket_of(f"trial_{i:05d}", weights) for i in range(3000)]
    assert draws == [asha.bracket_of(f"trial_{i:05d}", weights) for i in range(3000)]  # the same after a resume
    shares = [draws.count(b) / len(draws) for b in range(3)]
    assert shares == pytest.approx(weights, abs=0.03)
    assert asha.bracket_of("anything", [1.0]) == 0

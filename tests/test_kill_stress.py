"""Kill the driver at random moments and resume, again and again (issue 10, B8): before Ray
starts, while trials train or checkpoint, and during an export. Every study still ends with
exactly the requested finished trials, none left RUNNING, no Tune trial recorded twice, ASHA's
decisions those of an uninterrupted run, and an export that is whole. CI runs the full stress,
10 kills (AUTOFL_STRESS_KILLS=N runs N, e.g. 3 for a quick local check)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

from types import SimpleNamespace

import optuna
import pytest
import yaml
from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from test_search_e2e import AUTOFL, run, space_file, study_record

pytestmark = pytest.mark.slow
KILLS = int(os.environ.get("AUTOFL_STRESS_KILLS", "10"))
TRIALS = 256


def _killed_after(args: list, seconds: float) -> int | None:
    """Run autofl with `args`, SIGKILL its whole process group after `seconds`; its exit code if
    it ended first."""
    proc = subprocess.Popen([*AUTOFL, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def test_random_kills_and_resumes_end_with_exactly_the_requested_trials(tmp_path):
    rng = random.Random(20261122)
    home = tmp_path / "home"
    # a whole run takes longer than all the kills together. Most trials stop at round 1 (~0.2 s each), so the
    # first run alone finishes ~29 of them: with 32 trials CI (2026-11-26) finished the study in the third run,
    # before its kill. With 256, the 10 kills end with 39 finished here (a 6x margin; the test takes ~115 s)
    space = space_file(tmp_path, "stress", trials=TRIALS, rounds=12)
    data = yaml.safe_load(space.read_text())
    # a checkpoint every round; one trial at a time, so each trial is judged against all earlier ones
    space.write_text(yaml.safe_dump({**data, "checkpoint_every_s": 0, "resources": {"cpu": 1, "max_concurrent": 1}}))
    made = lambda: (home / "stress" / "space.yaml").is_file()  # noqa: E731
    moments = []  # seconds after start of each kill that happened
    for _ in range(KILLS):
        seconds = rng.uniform(0.5, 11.0)  # from before Ray is up to a few trials in
        args = ["search", "--resume", "stress"] if made() else ["search", "--space", space]
        if _killed_after([*args, "--dir", home], seconds) == 0:
            break  # the study finished before this kill
        moments.append(round(seconds, 1))
    db = home / "stress" / "optuna.db"
    done = [t for t in optuna.load_study(study_name="stress", storage=f"sqlite:///{db}").trials
            if t.state.name in ("COMPLETE", "PRUNED")] if db.is_file() else []
    print(f"killed after {moments} s, with {len(done)} of {TRIALS} trials finished")
    assert len(moments) >= min(KILLS, 3), moments  # the stress really killed drivers
    proc = run(["search", "--resume", "stress", "--dir", home] if made() else
               ["search", "--space", space, "--dir", home])
    assert proc.returncode == 0, (moments, proc.stderr[-3000:])

    trials = optuna.load_study(study_name="stress", storage=f"sqlite:///{home / 'stress' / 'optuna.db'}").trials
    real = [t for t in trials if not t.user_attrs.get("interrupted")]
    assert len(real) == TRIALS, (moments, [(t.number, t.state.name, t.user_attrs) for t in trials])
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in real), (moments, [t.state.name for t in real])
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    tune_ids = [t.user_attrs.get("tune_trial_id") for t in real]
    assert len(set(tune_ids)) == len(tune_ids), moments  # no Tune trial recorded twice
    for t in real:  # every round a trial reached is recorded once, in order
        assert sorted(t.intermediate_values) == list(range(1, max(t.intermediate_values) + 1))
    assert [_last_round(t) for t in real] == _uninterrupted_asha(real, data), moments
    # issue 42: the killed and resumed study is the one an uninterrupted run of its space and seed makes,
    # trial for trial: the same configs, per-round values and states, and no placeholder trial
    assert len(trials) == TRIALS, (moments, [(t.number, t.state.name, t.user_attrs) for t in trials])
    clean = run(["search", "--space", space, "--dir", home, "--name", "clean"])
    assert clean.returncode == 0, clean.stderr[-3000:]
    clean_trials = optuna.load_study(study_name="clean", storage=f"sqlite:///{home / 'clean' / 'optuna.db'}").trials
    assert study_record(trials) == study_record(clean_trials), moments


    out = tmp_path / "best.yaml"
    for _ in range(2):  # an export killed midway leaves no half-written file
        _killed_after(["best-config", "export", "stress", "-o", out, "--overwrite", "--dir", home],
                      rng.uniform(0.2, 2.0))
        if out.exists():
            assert yaml.safe_load(out.read_text())["metadata"]["study"] == "stress"
    proc = run(["best-config", "export", "stress", "-o", out, "--overwrite", "--dir", home])
    assert proc.returncode == 0 and yaml.safe_load(out.read_text())["metadata"]["study"] == "stress"


def _last_round(trial) -> int:
    return max(trial.intermediate_values)


def _uninterrupted_asha(trials: list, space: dict) -> list[int]:
    """The round at which ASHA, in one uninterrupted run, stops each trial (or max_t): Tune's own
    AsyncHyperBandScheduler, through its public hooks, fed the trials' round values in the order they ran."""
    sched = space["scheduler"]
    max_t = space["base"]["fl"]["rounds"]
    tune_asha = AsyncHyperBandScheduler(time_attr="round", metric="personal_val_acc", mode="max", max_t=max_t,
                                        grace_period=sched["grace_period"],
                                        reduction_factor=sched["reduction_factor"])
    stops = []
    for t in sorted(trials, key=lambda t: t.number):
        trial = SimpleNamespace(trial_id=str(t.number))
        tune_asha.on_trial_add(None, trial)
        stop = max_t
        for rnd in range(1, max_t + 1):
            if rnd not in t.intermediate_values:  # it stopped where ASHA would not have: the lists differ
                stop = rnd - 1
                break
            result = {"round": rnd, "personal_val_acc": t.intermediate_values[rnd]}
            if tune_asha.on_trial_result(None, trial, result) == TrialScheduler.STOP:
                stop = rnd
                break
        stops.append(stop)
    return stops

"""Kill the driver at random moments and resume, again and again (issue 10, B8): before Ray
starts, while trials train or checkpoint, and during an export. Every study still ends with
exactly the requested finished trials, none left RUNNING, no Tune trial recorded twice, and an
export that is whole. CI runs 3 kills; AUTOFL_STRESS_KILLS=10 runs the full stress."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import optuna
import pytest
import yaml

from test_search_e2e import AUTOFL, run, space_file

pytestmark = pytest.mark.slow
KILLS = int(os.environ.get("AUTOFL_STRESS_KILLS", "3"))


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
    space = space_file(tmp_path, "stress", trials=8, rounds=12)  # a whole run takes longer than a kill
    data = yaml.safe_load(space.read_text())
    space.write_text(yaml.safe_dump({**data, "checkpoint_every_s": 0}))  # a checkpoint every round
    made = lambda: (home / "stress" / "space.yaml").is_file()  # noqa: E731
    moments = []  # seconds after start of each kill that happened
    for _ in range(KILLS):
        seconds = rng.uniform(0.5, 11.0)  # from before Ray is up to a few trials in
        args = ["search", "--resume", "stress"] if made() else ["search", "--space", space]
        if _killed_after([*args, "--dir", home], seconds) == 0:
            break  # the study finished before this kill
        moments.append(round(seconds, 1))
    print(f"killed after {moments} s")
    assert len(moments) >= min(KILLS, 3), moments  # the stress really killed drivers
    proc = run(["search", "--resume", "stress", "--dir", home] if made() else
               ["search", "--space", space, "--dir", home])
    assert proc.returncode == 0, (moments, proc.stderr[-3000:])

    trials = optuna.load_study(study_name="stress", storage=f"sqlite:///{home / 'stress' / 'optuna.db'}").trials
    real = [t for t in trials if not t.user_attrs.get("interrupted")]
    assert len(real) == 8, (moments, [(t.number, t.state.name, t.user_attrs) for t in trials])
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in real), (moments, [t.state.name for t in real])
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    tune_ids = [t.user_attrs.get("tune_trial_id") for t in real]
    assert len(set(tune_ids)) == len(tune_ids), moments  # no Tune trial recorded twice
    for t in real:  # every round a trial reached is recorded once, in order
        assert sorted(t.intermediate_values) == list(range(1, max(t.intermediate_values) + 1))

    out = tmp_path / "best.yaml"
    for _ in range(2):  # an export killed midway leaves no half-written file
        _killed_after(["best-config", "export", "stress", "-o", out, "--overwrite", "--dir", home],
                      rng.uniform(0.2, 2.0))
        if out.exists():
            assert yaml.safe_load(out.read_text())["metadata"]["study"] == "stress"
    proc = run(["best-config", "export", "stress", "-o", out, "--overwrite", "--dir", home])
    assert proc.returncode == 0 and yaml.safe_load(out.read_text())["metadata"]["study"] == "stress"

"""A Ctrl-C is told apart from a finished run even when it lands while no trial is open (CI saw a
Ctrl-C between one batch of trials and the next settle the study as finished, exit 0)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from autofl.tuning.tune import interrupt
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.store.study import StudyFolder
from autofl.tuning.tune.experiment import StudyInterrupted, settle_run


def _deliver_sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.time() + 5
    while not interrupt.received() and time.time() < deadline:  # Python runs handlers between bytecodes
        time.sleep(0.01)


def test_the_watch_notes_a_sigint_runs_tunes_handler_and_puts_the_old_handler_back():
    before = signal.getsignal(signal.SIGINT)
    calls: list[int] = []
    with interrupt.watching():
        signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))  # stands in for Tune's
        interrupt.InterruptWatch().setup()
        interrupt.InterruptWatch().setup()  # a second setup does not wrap twice
        assert not interrupt.received()
        _deliver_sigint()
        assert interrupt.received() and calls == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before
    with interrupt.watching():  # the next run starts unaware of the last one's signal
        assert not interrupt.received()


def test_a_default_handler_under_the_watch_still_raises_keyboard_interrupt():
    with interrupt.watching():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupt.InterruptWatch().setup()
        with pytest.raises(KeyboardInterrupt):
            _deliver_sigint()
            time.sleep(1)
        assert interrupt.received()


def _study(tmp_path: Path) -> tuple[StudyFolder, Ledger]:
    root = tmp_path / "s"
    root.mkdir()
    (root / "space.yaml").write_text(yaml.safe_dump({
        "study": "s", "base": {"fl": {"rounds": 2}}, "trials": 4,
        "params": {"fl.lr": {"type": "float", "low": 0.001, "high": 1.0}}}))
    ledger = Ledger(root)
    ledger.study(create_directions=["maximize"])
    return StudyFolder(root), ledger


def test_a_ctrl_c_while_no_trial_is_open_leaves_the_run_resumable(tmp_path):
    study, ledger = _study(tmp_path)
    assert not ledger.open_in_run("run-1")  # e.g. between one batch of trials and the next
    with pytest.raises(StudyInterrupted, match="resume it with autofl search --resume 's'"):
        settle_run(study, study.space(), ledger, "run-1", {}, interrupted=True)
    settle_run(study, study.space(), ledger, "run-1", {}, interrupted=False)  # no signal: the run ended

"""Whether Ctrl-C (or SIGTERM, forwarded as Ctrl-C) stopped the Tune experiment.

Tune stops gracefully on the first SIGINT and `Tuner.fit()` returns as if the experiment had
ended. The driver used to infer an interruption from trials the run left open; a Ctrl-C that
arrives while no trial is open (one batch of trials just finished, the next not yet suggested)
left nothing open, so the study was settled as finished with trials it never ran (CI saw exit 0
for a Ctrl-C). `InterruptWatch` is a Tune callback: its `setup` runs after Tune has installed its
own SIGINT handler, and wraps it so the signal is noted here before Tune's stop runs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray.tune import Callback

_received = threading.Event()


@contextmanager
def watching() -> Iterator[None]:
    """Around `Tuner.fit()`: forget an earlier run's interruption, and afterwards put back the
    SIGINT handler that was there before (Tune leaves its own installed when no signal came)."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    _received.clear()
    try:
        yield
    finally:
        if main and before is not None:
            signal.signal(signal.SIGINT, before)


def received() -> bool:
    """Whether a SIGINT reached the experiment since `watching()` began."""
    return _received.is_set()


def note_and_forward(handler: Any):
    """A SIGINT handler that notes the signal, then does what `handler` (Tune's) does."""

    def on_sigint(signum: int, frame: Any) -> None:
        _received.set()
        if callable(handler):
            handler(signum, frame)
        elif handler != signal.SIG_IGN:
            raise KeyboardInterrupt

    on_sigint.forwards_to = handler  # type: ignore[attr-defined]
    return on_sigint


class InterruptWatch(Callback):
    """Wraps the SIGINT handler Tune installed for its run (main thread only: elsewhere neither
    Tune nor this can install one)."""

    def setup(
        self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None, **info: Any
    ) -> None:  # Tune's Callback.setup signature
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGINT)
        if not hasattr(current, "forwards_to"):  # not wrapped already
            signal.signal(signal.SIGINT, note_and_forward(current))

"""How large a re-evaluation may be (it imports only autofl.errors: the CLI's argument parser reads it without the API).

A re-evaluation is (top + 1) x seeds runs, one Tune trial each: issue 42's `--seeds 10000` planned
40,000 trials, and Tune then took 570 s to stop on SIGTERM. At most 21 x 100 = 2,100 runs.
"""

from __future__ import annotations

from autofl.errors import AutoFLError

MAX_SEEDS = 100
MAX_TOP = 20


def check_reeval_size(seeds: int, top: int) -> None:
    """One line naming the argument and its allowed range (AutoFLError, exit 2)."""
    if not 2 <= seeds <= MAX_SEEDS:
        raise AutoFLError(f"seeds: {seeds}; allowed: 2..{MAX_SEEDS}")
    if not 1 <= top <= MAX_TOP:
        raise AutoFLError(f"top: {top}; allowed: 1..{MAX_TOP}")

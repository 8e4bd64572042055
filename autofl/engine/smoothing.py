"""Smoothed validation metrics: `<metric>_last3`, the mean of a validation accuracy over the run's
last 3 evaluated rounds (fewer before the third). On a small validation set a round's own value moves
with SGD's noise from round to round; as a study's objective the smoothed twin ranks configs, and ASHA
judges them at its rungs, by where they are rather than by one round's draw (issue 39: on the digits
tables of the search benchmark it took the default search's regret from 2.44 to 0.70 points)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autofl.engine.metric_keys import SMOOTHED_BASES, SMOOTHING_ROUNDS, smoothed_key


def smoothed_metrics(history: Sequence[dict[str, Any]], rounds: int = SMOOTHING_ROUNDS) -> dict[str, float]:
    """`<metric>_last<rounds>` of the last entry of `history` (the evaluated rounds, oldest first), for each
    of `SMOOTHED_BASES` that entry holds: the mean over the last `rounds` entries that hold it."""
    if not history:
        return {}
    out: dict[str, float] = {}
    for base in SMOOTHED_BASES:
        if base not in history[-1]:
            continue
        values = [float(m[base]) for m in history[-rounds:] if base in m]
        out[smoothed_key(base, rounds)] = sum(values) / len(values)
    return out

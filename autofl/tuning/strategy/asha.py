"""Asynchronous successive halving (ASHA), the rule alone: pure functions over rung values.

Ray Tune's `AsyncHyperBandScheduler` (one bracket) decides this way, and autofl's scheduler
(autofl/tuning/tune/scheduler.py) and the search benchmark's replay (scripts/search_benchmark.py) both
call these functions, so a live study and its replay stop exactly the same trials:
- the rungs sit at `grace_period * reduction_factor**k` rounds, up to `max_t`;
- a trial reaching round r is judged at the highest rung <= r where it has no value yet;
- it stops if its value is below the (1 - 1/reduction_factor) quantile of the values the other
  trials recorded at that rung ("worse than the top 1/rf"), and its value is recorded there;
- a trial at `max_t` or beyond is finished, not judged.
Values are kept in the objective's own units; `mode` says which way is better.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence

import numpy as np


def milestones(grace_period: float, max_t: float, reduction_factor: float, bracket: int = 0) -> list[float]:
    """The rungs' rounds of bracket `bracket` (0: the only one of plain ASHA), ascending (Tune's
    formula, so the same rounds for the same settings): bracket s starts at grace * rf**s."""
    count = int(math.log(max_t / grace_period) / math.log(reduction_factor) - bracket + 1)
    return [grace_period * reduction_factor ** (k + bracket) for k in range(count)]


def bracket_weights(grace_period: float, max_t: float, reduction_factor: float, brackets: int) -> list[float]:
    """The chance of a new trial to go to each bracket (asynchronous Hyperband), as Tune's: a
    softmax over the brackets' rung counts."""
    sizes = [len(milestones(grace_period, max_t, reduction_factor, s)) for s in range(brackets)]
    exp = [math.e ** (n - max(sizes)) for n in sizes]
    return [e / sum(exp) for e in exp]


def bracket_of(trial_key: str, weights: Sequence[float]) -> int:
    """The bracket of a trial, drawn with `weights` from a hash of its key (Tune draws at random
    and forgets; a hash gives the same bracket again after a resume and in a replay)."""
    if len(weights) == 1:
        return 0
    u = int.from_bytes(hashlib.sha256(trial_key.encode()).digest()[:8], "big") / 2.0**64
    total = 0.0
    for index, weight in enumerate(weights):
        total += weight
        if u < total:
            return index
    return len(weights) - 1


def rung_to_judge(rungs: Sequence[float], reached: float, judged: Iterable[float]) -> float | None:
    """The rung a trial that reached round `reached` is judged at: the highest one at or below it
    where the trial has no value yet (`judged`), or None."""
    done = set(judged)
    for milestone in sorted(rungs, reverse=True):
        if reached >= milestone and milestone not in done:
            return milestone
    return None


def cutoff(rung_values: Sequence[float], mode: str, reduction_factor: float) -> float | None:
    """The value a trial must reach at a rung to continue, in the objective's units (None: empty rung)."""
    if not rung_values:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return sign * float(np.nanpercentile([sign * v for v in rung_values], (1 - 1 / reduction_factor) * 100))


def decide(rung_values: Sequence[float], value: float, mode: str, reduction_factor: float) -> bool:
    """Whether a trial with `value` at a rung holding `rung_values` (the other trials' values
    there) stops: True when its value is worse than the rung's cutoff."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode: {mode!r}; allowed: max, min")
    if not rung_values:
        return False
    sign = 1.0 if mode == "max" else -1.0
    threshold = np.nanpercentile([sign * v for v in rung_values], (1 - 1 / reduction_factor) * 100)
    return bool(sign * value < threshold)


def recorded_values(
    curve: dict[int, float], rungs: Sequence[float], max_t: float, finished: bool
) -> dict[float, float]:
    """The values a trial with per-round values `curve` left in the rungs, replayed as the
    scheduler saw them: each result below `max_t` is recorded at `rung_to_judge`'s rung (at most
    one), and a finished trial's last result is offered once more (Tune hands it to the scheduler
    again when the trial completes, whatever its round)."""
    out: dict[float, float] = {}
    rounds = sorted(curve)
    offered = [r for r in rounds if r < max_t] + (rounds[-1:] if finished else [])
    for rnd in offered:
        milestone = rung_to_judge(rungs, rnd, out)
        if milestone is not None:
            out[milestone] = curve[rnd]
    return out

"""Metrics and objectives on the search side, defined once: which metrics a trial reports, which
are test metrics (reported, never optimized), Optuna's direction of a mode, and which of two
values is better in a mode. The search, the live view, status, re-evaluation and the report use
these instead of writing `max if mode == "max" else min` again."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

from autofl.engine.metric_keys import METRIC_KEYS, SMOOTHED_BASES, SMOOTHED_KEYS, smoothed_key

T = TypeVar("T")

REPORTED_KEYS = (*METRIC_KEYS, "node_id")  # a round's metrics and the Ray node that trained it
# what a study may optimize: validation metrics only (the test split is reported, never optimized)
VALIDATION_OBJECTIVES = (
    "personal_val_acc",
    "personal_val_acc_unweighted",
    "personal_val_acc_p10",
    "personal_val_acc_std",
    "global_val_acc",
    "unseen_val_acc",
    *SMOOTHED_KEYS,  # each one's mean over the last 3 evaluated rounds (autofl.engine.smoothing)
)
# what a space that names no objective optimizes: the mean personal validation accuracy over a trial's
# last 3 evaluated rounds. On the large search-benchmark tables it is, with `best-config export`'s
# re-evaluation of the top 3 on 2 fresh seeds, the setting whose chosen config came closest to the best
# under validation noise (issue 39, docs/search-quality.md)
DEFAULT_OBJECTIVE = smoothed_key("personal_val_acc")


def unsmoothed(metric: str) -> str:
    """The metric a smoothed objective averages (`personal_val_acc` for `personal_val_acc_last3`); any
    other metric itself."""
    return next((base for base in SMOOTHED_BASES if smoothed_key(base) == metric), metric)


# participation_gap and the harmed fractions are read off the test splits: test metrics
TEST_METRICS = (
    "personal_test_acc",
    "personal_test_acc_unweighted",
    "personal_test_acc_std",
    "personal_test_acc_p10",
    "global_test_acc",
    "unseen_test_acc",
    "participation_gap",
    "harmed_frac",
    "harmed_vs_global",
)
MODES = ("max", "min")


def default_mode(metric: str) -> Literal["max", "min"]:
    """The direction a metric is optimized in unless the space says: min for a spread (*_std), else max."""
    return "min" if metric.endswith("_std") else "max"


def direction(mode: str) -> Literal["maximize", "minimize"]:
    """Optuna's name of a mode: maximize / minimize."""
    names: dict[str, Literal["maximize", "minimize"]] = {"max": "maximize", "min": "minimize"}
    return names[mode]


def sign(mode: str) -> float:
    """+1 for max, -1 for min: `sign(mode) * value` is larger when better."""
    return {"max": 1.0, "min": -1.0}[mode]


def better(value: float, than: float | None, mode: str) -> bool:
    """Whether `value` is strictly better than `than` (None: nothing yet, so any finite value is)."""
    if value is None or not math.isfinite(value):
        return False
    return than is None or sign(mode) * value > sign(mode) * than


def best(items: Iterable[T], key: Callable[[T], float], mode: str) -> T | None:
    """The item with the best `key` in `mode` (the first of equals), or None if there is none."""
    pick = max if mode == "max" else min
    items = list(items)
    return pick(items, key=key) if items else None


def best_first(items: Iterable[T], key: Callable[[T], float], mode: str) -> list[T]:
    """`items` sorted best first in `mode` (stable among equals)."""
    return sorted(items, key=key, reverse=mode == "max")


def gain(diff: dict[str, Any], mode: str) -> tuple[float, float, float]:
    """A paired difference (candidate - reference: mean, ci_low, ci_high) as a gain in `mode`:
    (gain, low, high), positive when the candidate is better."""
    if mode == "max":
        return diff["mean"], diff["ci_low"], diff["ci_high"]
    return -diff["mean"], -diff["ci_high"], -diff["ci_low"]

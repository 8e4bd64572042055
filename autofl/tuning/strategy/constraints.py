"""Constraints on a study's reported metrics (a space's `constraints:`), e.g.

    constraints: ["personal_val_acc_p10 >= 0.6", "train_loss <= 2"]

Each is `<metric> <= <bound>` or `<metric> >= <bound>` on a metric every trial reports (a
validation metric, the training loss, and whatever the engine adds to its reported keys; a test
metric is refused, as it is for the objective). A trial's constraint values are Optuna's: one float
per constraint, `value - bound` for `<=` and `bound - value` for `>=`, so a value <= 0 is met.

The ledger records them on each COMPLETE trial through Optuna's public `Trial.set_constraint`
(Optuna 5 deprecates the samplers' `constraints_func` for it; the values are the same), with the
user attr `feasible`. The samplers that use constraints (TPE, GP) then model them, Optuna's
`best_trial` / `best_trials` skip infeasible trials, and so do autofl's best trial, best-config
export and re-evaluation. A PRUNED trial has no final metrics: it gets no constraint values, as
Optuna's own constraints_func is documented to skip it. A sampler that ignores constraints
(random, grid, QMC, CMA-ES) with constraints declared is refused when the space is parsed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from autofl.tuning.strategy.objectives import REPORTED_KEYS, TEST_METRICS

# the sampler kinds whose Optuna sampler models constraints (Trial.set_constraint / trial.constraints)
CONSTRAINED_SAMPLERS = ("tpe", "gp")
FEASIBLE_ATTR = "feasible"  # a COMPLETE trial's user attr in a constrained study
# a constraint whose metric the trial did not report counts as violated by this much (a finite
# value: GP standardizes the values, and an infinity would make them NaN)
MISSING_VIOLATION = 1.0
_FORM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*(\S+)\s*$")


def constraint_metrics() -> tuple[str, ...]:
    """The metrics a constraint may name: every reported metric but the round, the Ray node and
    test metrics (the test split is reported, never optimized or constrained)."""
    return tuple(k for k in REPORTED_KEYS if k not in ("round", "node_id") and not is_test_metric(k))


def is_test_metric(name: str) -> bool:
    return name in TEST_METRICS or "test" in name.split("_")


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: Literal["<=", ">="]
    bound: float

    @property
    def key(self) -> str:
        """Its name in Optuna's trial constraints (and the dashboard): as written, normalized."""
        return f"{self.metric} {self.op} {self.bound:g}"

    def value(self, attrs: Mapping[str, Any]) -> float:
        """Optuna's constraint value for a trial with these reported metrics: <= 0 when met."""
        reported = attrs.get(self.metric)
        if isinstance(reported, bool) or not isinstance(reported, (int, float)) or not math.isfinite(reported):
            return MISSING_VIOLATION
        return float(reported) - self.bound if self.op == "<=" else self.bound - float(reported)


def parse_constraint(text: Any, field: str) -> Constraint:
    """One constraint of a space, or ValueError naming `field` (e.g. constraints[1]) and what is allowed."""
    allowed = ", ".join(constraint_metrics())
    form = "'<metric> >= <number>' or '<metric> <= <number>'"
    match = _FORM.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{field}: {text!r} is not a constraint; allowed: {form}, with a metric among {allowed}")
    metric, op, bound_text = match.groups()
    if is_test_metric(metric):
        raise ValueError(
            f"{field}: {metric!r} is a test metric (reported, never optimized or constrained); allowed: {allowed}"
        )
    if metric not in constraint_metrics():
        raise ValueError(f"{field}: {metric!r} is not a reported metric; allowed: {allowed}")
    try:
        bound = float(bound_text)
    except ValueError:
        bound = math.nan
    if not math.isfinite(bound):
        raise ValueError(f"{field}: bound {bound_text!r} is not a finite number; allowed: {form}")
    return Constraint(metric, op, bound)  # type: ignore[arg-type]


def parse_constraints(texts: Sequence[str]) -> list[Constraint]:
    return [parse_constraint(text, f"constraints[{i}]") for i, text in enumerate(texts)]


def constraint_values(constraints: Sequence[Constraint], attrs: Mapping[str, Any]) -> dict[str, float]:
    """Optuna's constraint values of a trial whose reported metrics are `attrs`, by constraint key
    (what a sampler's `constraints_func` would return, as a dict for `Trial.set_constraint`)."""
    return {c.key: c.value(attrs) for c in constraints}


def is_feasible(trial: Any) -> bool:
    """Whether a (Frozen)Trial meets every constraint it carries (one without any does)."""
    return all(v <= 0 for v in trial.constraints.values())


def violated(constraints: Sequence[Constraint], attrs: Mapping[str, Any]) -> list[str]:
    """The constraints (as keys) that a trial with these reported metrics misses."""
    return [c.key for c in constraints if c.value(attrs) > 0]


def feasibility_line(constraints: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """A constrained study's constraints and how many COMPLETE trials meet them (which do not), from
    `study.trial_rows`' rows (Optuna's state, `feasible`)."""
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    infeasible = [r["number"] for r in complete if not r["feasible"]]
    shown = ", ".join(f"#{n}" for n in infeasible[:20]) + (", ..." if len(infeasible) > 20 else "")
    return (
        f"constraints: {'; '.join(constraints)}; {len(complete) - len(infeasible)} of {len(complete)} "
        f"completed trials feasible" + (f" (infeasible, never the best: {shown})" if infeasible else "")
    )

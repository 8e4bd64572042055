"""A sampler's proposal that a finished trial already trained (`sampler.skip_repeats`).

On a finite space (categorical or stepped params) a sampler re-proposes configs it has trained:
TPE on the search benchmark's 40-config grid did so for most of its trials past a third of the
grid's compute. Training with the space's seed is deterministic, so such a trial would only repeat
its twin's rounds. With `skip_repeats` the proposal is told its twin's outcome at once (its
per-round values, its state and value; Optuna's FAQ recipe for duplicated samples, through the
public `Study.tell`) and the sampler is asked again, up to REPEAT_TRIES times; then the repeat is
trained. A told repeat carries `repeat_of` (its twin's number) and counts against no budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REPEAT_TRIES = 20
# what a repeat copies of its twin besides values: the metrics the report and export read
COPIED_ATTRS = ("personal_test_acc", "global_test_acc", "round", "feasible")


def is_repeat(trial: Any) -> bool:
    return "repeat_of" in trial.user_attrs


def config_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def trained_configs(study: Any) -> dict[tuple, Any]:
    """Each config COMPLETE or PRUNED trials trained (not told repeats), by `config_key`: the first
    such trial, the twin a repeat of it is told as."""
    from optuna.trial import TrialState

    trained: dict[tuple, Any] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if not is_repeat(t):
            trained.setdefault(config_key(t.params), t)
    return trained


def tell_as_twin(study: Any, trial: Any, twin: Any) -> None:
    """Finish `trial` as `twin` finished: its per-round values, state and value(s)."""
    from optuna.trial import TrialState

    for step, value in sorted(twin.intermediate_values.items()):
        trial.report(value, step)
    for key in COPIED_ATTRS:
        if key in twin.user_attrs:
            trial.set_user_attr(key, twin.user_attrs[key])
    for key, value in twin.constraints.items():  # a constrained study: the twin's constraint values
        trial.set_constraint(key, value)
    trial.set_user_attr("repeat_of", twin.number)
    if twin.state == TrialState.COMPLETE:
        study.tell(trial, twin.values if len(twin.values) > 1 else twin.value)
    else:
        study.tell(trial, state=TrialState.PRUNED)


def ask_unseen(
    study: Any,
    define: Callable[[Any], Any],
    tries: int = REPEAT_TRIES,
    space_size: int | None = None,
    fixed: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """`study.ask()` and `define(trial)` (define-by-run), skipping proposals a finished trial already
    trained (told as their twin). Returns the trial to train and what `define` returned. Once every
    one of a finite space's `space_size` configs was trained, nothing is unseen: a plain ask (as with
    `tries` 0). `fixed`: params every proposal keeps (a population's non-fusible values), enqueued
    before each ask, Optuna's public way to fix some params of the next ask."""
    trained = trained_configs(study) if tries else {}  # a told repeat adds no config: read once per ask
    if space_size and len(trained) >= space_size:
        tries = 0
    for attempt in range(tries + 1):
        if fixed is not None:
            study.enqueue_trial(fixed, skip_if_exists=False)
        trial = study.ask()
        returned = define(trial)
        twin = None if attempt == tries else trained.get(config_key(trial.params))
        if twin is None:
            return trial, returned
        tell_as_twin(study, trial, twin)
    raise AssertionError("unreachable")

"""Optuna's grid sampler for a study driven ask-and-tell (Tune's OptunaSearch, the benchmark's replay)."""

from __future__ import annotations

from typing import Any

import optuna


class StudyGridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler, except that it never calls `Study.stop()` once every grid point is
    taken: only an `optimize` loop accepts that call (ask-and-tell raises RuntimeError from `tell`);
    here the study's trial budget, at most the grid's size, ends the study."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None

"""How a study searches: which Optuna sampler proposes its trials and which Tune scheduler stops
them early, chosen in the space file's `sampler:` and `scheduler:` sections.

Everything here is the libraries' own: Optuna's TPE, random, grid, GP, CMA-ES and QMC samplers;
Tune's asynchronous successive halving (ASHA: one bracket; `hyperband`: several brackets, i.e.
asynchronous Hyperband) and median stopping rule. `check_strategy` refuses the combinations the
libraries cannot run (a grid over a continuous range, CMA-ES without a numeric param or with
several objectives, an early-stopping scheduler on a multi-objective study) while the space is
validated, before Ray starts (the `sampler:`/`scheduler:` sections are declared in
`autofl.tuning.strategy.spec`, the checks live with the space in `autofl.tuning.strategy.space`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofl.tuning.strategy.space import start_points

if TYPE_CHECKING:
    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.strategy.space import SearchSpace


def study_start_points(space: SearchSpace) -> list[dict[str, Any]]:
    """The trials a new study runs first (the paper default, one per method in a cross-method
    study), except under a grid, which visits the default among its points anyway."""
    return [] if space.sampler.kind == "grid" else start_points(space)


def make_sampler(space: SearchSpace, run_name: str | None = None):
    """The study's sampler: Optuna's sampler of `space.sampler`, built for each trial with a seed
    from (the space's seed, the trial's place in the study), so that every run of the study, a
    resumed or joined driver's included, proposes what one uninterrupted run would
    (autofl/tuning/strategy/trial_sampler.py). `run_name` is accepted for callers that name the run; the
    proposals do not depend on it."""
    from autofl.tuning.strategy.trial_sampler import TrialSeededSampler  # lazy: pulls optuna

    return TrialSeededSampler(space)


def make_scheduler(space: SearchSpace, ledger: Ledger):
    """The Tune scheduler of `space.scheduler` over FL rounds (None: every trial runs to the end)."""
    spec = space.scheduler
    if spec.kind == "none":
        return None
    if spec.kind == "median":
        from ray.tune.schedulers import MedianStoppingRule

        return MedianStoppingRule(
            time_attr="round", grace_period=spec.grace_period, min_samples_required=spec.min_samples_required
        )
    from autofl.tuning.tune.scheduler import StudyASHA  # lazy: pulls ray

    return StudyASHA(
        ledger,
        time_attr="round",
        max_t=space.max_rounds,
        grace_period=spec.grace_period,
        reduction_factor=spec.reduction_factor,
        brackets=spec.brackets if spec.kind == "hyperband" else 1,
    )

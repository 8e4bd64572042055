"""How a study searches: which Optuna sampler proposes its trials and which Tune scheduler stops
them early, chosen in the space file's `sampler:` and `scheduler:` sections.

Everything here is the libraries' own: Optuna's TPE, random, grid, GP, CMA-ES and QMC samplers;
Tune's asynchronous successive halving (ASHA: one bracket; `hyperband`: several brackets, i.e.
asynchronous Hyperband) and median stopping rule. `check_strategy` refuses the combinations the
libraries cannot run (a grid over a continuous range, CMA-ES without a numeric param or with
several objectives, an early-stopping scheduler on a multi-objective study) while the space is
validated, before Ray starts (the `sampler:`/`scheduler:` sections are declared in
`autofl.tuning.strategy_spec`, the checks live with the space in `autofl.tuning.space`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofl.tuning.space import all_params, grid_values, start_points

if TYPE_CHECKING:
    from autofl.tuning.ledger import Ledger
    from autofl.tuning.space import SearchSpace

def study_start_points(space: SearchSpace) -> list[dict[str, Any]]:
    """The trials a new study runs first (the paper default, one per method in a cross-method
    study), except under a grid, which visits the default among its points anyway."""
    return [] if space.sampler.kind == "grid" else start_points(space)


FIRST_RUN = "run-1"


def run_seed(seed: int, run_name: str | None = None) -> int:
    """The sampler seed of a study's run: the space's seed for its first run, and for each later run
    (an extension, a joined driver) one drawn from (seed, run name). A sampler restarted with the
    first run's seed would propose that run's configs again, from its first random draw on."""
    import zlib

    import numpy as np

    if run_name is None or run_name == FIRST_RUN:
        return seed
    return int(np.random.SeedSequence([seed, zlib.crc32(run_name.encode())]).generate_state(1)[0])


def make_sampler(space: SearchSpace, run_name: str | None = None):
    """The Optuna sampler of `space.sampler`, seeded with the space's seed (see run_seed)."""
    import optuna

    spec = space.sampler
    options = spec.options()
    seed = run_seed(space.seed, run_name)
    if spec.kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **options)
    if spec.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.kind == "grid":
        from autofl.tuning.grid_sampler import StudyGridSampler

        # `or []`: never taken, the space rejects a continuous range under a grid sampler
        return StudyGridSampler({name: grid_values(p) or [] for name, p in all_params(space).items()}, seed=seed)
    if spec.kind == "gp":
        return optuna.samplers.GPSampler(seed=seed, **options)
    if spec.kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, **options)
    return optuna.samplers.QMCSampler(seed=seed, **options)


def make_scheduler(space: SearchSpace, ledger: Ledger):
    """The Tune scheduler of `space.scheduler` over FL rounds (None: every trial runs to the end)."""
    spec = space.scheduler
    if spec.kind == "none":
        return None
    if spec.kind == "median":
        from ray.tune.schedulers import MedianStoppingRule

        return MedianStoppingRule(time_attr="round", grace_period=spec.grace_period,
                                  min_samples_required=spec.min_samples_required)
    from autofl.tuning.scheduler import StudyASHA

    return StudyASHA(ledger, time_attr="round", max_t=space.max_rounds, grace_period=spec.grace_period,
                     reduction_factor=spec.reduction_factor, brackets=spec.brackets if spec.kind == "hyperband" else 1)

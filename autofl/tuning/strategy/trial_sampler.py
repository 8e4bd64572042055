"""A study's sampler, seeded per trial: what it proposes depends only on the space, the study's seed
and the trials the study holds, never on the process that asks (issue 42).

One long-lived Optuna sampler draws from one random stream: a driver killed and resumed starts a new
stream (or reseeds it from the OS), so the configs proposed after a kill differed from an
uninterrupted run's with the same seed, and two resumes from one kill point differed from each other.
Here the sampler of the space's kind is built afresh, through Optuna's public constructors and
`BaseSampler` hooks, for each trial, with a seed drawn from (study seed, trial index): the trial's
number less the interrupted placeholders before it (autofl/tuning/store/ledger.py), so a placeholder
never shifts the seeds of the trials after it. A parameter sampled on its own (`sample_independent`,
e.g. every parameter of a default TPE) is drawn by a sampler seeded with (study seed, trial index,
parameter name), so its value does not depend on the draws before it in the same process: a trial
whose driver was killed while it set its parameters is adopted by the next driver (the ledger's
`release`), which sets the missing ones to exactly what the killed driver would have set. Every
other input of Optuna's samplers is the study's storage (TPE, GP, CMA-ES read the trials; CMA-ES
keeps its optimizer in trial attributes), which a resumed driver reads as the killed one left it.

Two kinds keep the study seed itself, because their seed fixes a sequence across trials rather
than a draw: the grid (its seed shuffles the grid once; trial n takes point n) and QMC (its seed
scrambles the sequence; the study's storage counts the samples taken). Their fallback random
sampler is seeded per trial.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.samplers import BaseSampler

from autofl.tuning.store.ledger import is_placeholder
from autofl.tuning.strategy.grid_sampler import StudyGridSampler
from autofl.tuning.strategy.space import all_params, grid_values

if TYPE_CHECKING:
    from autofl.tuning.strategy.space import SearchSpace


def trial_seed(seed: int, index: int, param: str | None = None) -> int:
    """The sampler seed of the study's `index`-th proposal, or of its parameter `param` when that
    is sampled on its own (NumPy's SeedSequence of them; the name enters as its CRC-32)."""
    entropy = [int(seed) & 0xFFFFFFFF, int(index), *([zlib.crc32(param.encode())] if param is not None else [])]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def build_sampler(space: SearchSpace, seed: int) -> BaseSampler:
    """Optuna's sampler of `space.sampler` (kind and options) for one trial, seeded with `seed`."""
    spec = space.sampler
    options = spec.options()
    if spec.kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **options)
    if spec.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.kind == "grid":
        # the study seed: it shuffles the grid, and trial n takes the shuffled grid's point n
        grid = {name: grid_values(p) for name, p in all_params(space).items()}
        finite = {name: values for name, values in grid.items() if values is not None}
        assert len(finite) == len(grid), "check_strategy accepts a grid of finite value sets only"
        return StudyGridSampler(finite, seed=space.seed)
    if spec.kind == "gp":
        return optuna.samplers.GPSampler(seed=seed, **options)
    if spec.kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, **options)
    # the study seed scrambles the one sequence every trial draws from
    return optuna.samplers.QMCSampler(
        seed=space.seed, independent_sampler=optuna.samplers.RandomSampler(seed=seed), **options
    )


class TrialSeededSampler(BaseSampler):
    """The space's Optuna sampler, rebuilt for each trial with `trial_seed(space.seed, index)`."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self._number: int | None = None  # the trial the current sampler was built for
        self._index = 0  # that trial's proposal index
        self._current: BaseSampler = build_sampler(space, trial_seed(space.seed, 0))

    def __getstate__(self) -> dict[str, Any]:  # a restored driver builds the sampler again
        return {"space": self.space}

    def __setstate__(self, state: dict[str, Any]) -> None:
        TrialSeededSampler.__init__(self, state["space"])

    @property
    def current(self) -> BaseSampler:
        """The Optuna sampler of the trial last started (its class is the space's kind's)."""
        return self._current

    def _build_for(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        """Build the sampler of `trial` unless the current one is (the grid's draws are fixed by the
        study seed: one sampler serves every trial). True if it was built now."""
        if trial.number == self._number or self.space.sampler.kind == "grid":
            return False
        self._number = trial.number
        self._index = proposal_index(study, trial.number)
        self._current = build_sampler(self.space, trial_seed(self.space.seed, self._index))
        return True

    def _for(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> BaseSampler:
        """The sampler of `trial`; an adopted trial (one a killed driver created, set again by the
        next) comes here without `before_trial`: its sampler is built and started as a new one is."""
        if self._build_for(study, trial):
            self._current.before_trial(study, trial)
        return self._current

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._build_for(study, trial)
        self._current.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return self._for(study, trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        return self._for(study, trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str, param_distribution: Any
    ) -> Any:
        current = self._for(study, trial)
        if self.space.sampler.kind == "grid":  # the grid point of the trial's number
            return current.sample_independent(study, trial, param_name, param_distribution)
        own = build_sampler(self.space, trial_seed(self.space.seed, self._index, param_name))
        return own.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: Any, values: Sequence[float] | None
    ) -> None:
        self._current.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Nothing to reseed: every trial's seed is fixed by the study (Optuna calls this in
        parallel `optimize` workers, which must still propose the same configs)."""


def proposal_index(study: optuna.Study, number: int) -> int:
    """Trial `number`'s place among the study's proposals: its number less the interrupted
    placeholders before it (trials no driver trained; see autofl.tuning.store.ledger.counted)."""
    return number - sum(1 for t in study.get_trials(deepcopy=False) if t.number < number and is_placeholder(t))

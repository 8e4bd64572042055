"""How a study searches: which Optuna sampler proposes its trials and which Tune scheduler stops
them early, chosen in the space file's `sampler:` and `scheduler:` sections.

Everything here is the libraries' own: Optuna's TPE, random, grid, GP, CMA-ES and QMC samplers;
Tune's asynchronous successive halving (ASHA: one bracket; `hyperband`: several brackets, i.e.
asynchronous Hyperband) and median stopping rule. `check_strategy` refuses the combinations the
libraries cannot run (a grid over a continuous range, CMA-ES without a numeric param or with
several objectives, an early-stopping scheduler on a multi-objective study) while the space is
validated, before Ray starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from autofl.config import Strict

if TYPE_CHECKING:
    from autofl.search.ledger import Ledger
    from autofl.search.space import ParamSpec, SearchSpace

# the options each sampler kind takes (named as in Optuna's sampler classes)
SAMPLER_OPTIONS: dict[str, tuple[str, ...]] = {
    "tpe": ("n_startup_trials", "multivariate", "group", "constant_liar", "n_ei_candidates"),
    "random": (),
    "grid": (),
    "gp": ("n_startup_trials", "deterministic_objective"),
    "cmaes": ("n_startup_trials", "sigma0", "popsize", "use_separable_cma", "with_margin", "lr_adapt"),
    "qmc": ("qmc_type", "scramble"),
}
SCHEDULER_OPTIONS: dict[str, tuple[str, ...]] = {
    "asha": ("grace_period", "reduction_factor"),
    "hyperband": ("grace_period", "reduction_factor", "brackets"),
    "median": ("grace_period", "min_samples_required"),
    "none": (),
}
# TPE's settings when the space names none: Optuna's, except 20 random trials before the model
# (Optuna: 10), measured by scripts/search_benchmark.py (README "How good is the search?"): with 10,
# TPE re-proposed configs it had already trained and trailed random search + ASHA at 10-25% of a
# grid's compute; with 20 and independent (univariate) densities it was at or below random search +
# ASHA at every budget on both tasks, and multivariate TPE was never better than it
TPE_DEFAULTS: dict[str, Any] = {"n_startup_trials": 20, "multivariate": False, "group": False, "constant_liar": True,
                                "n_ei_candidates": 24}


def _only_own_options(spec: Strict, owners: dict[str, tuple[str, ...]], section: str) -> None:
    kind = getattr(spec, "kind")
    for name in sorted(spec.model_fields_set - {"kind"}):
        if name not in owners[kind]:
            takes = ", ".join(owners[kind]) or "no options"
            users = ", ".join(k for k, opts in owners.items() if name in opts)
            raise ValueError(f"{section}.{name}: an option of kind {users}, not of {kind!r}; kind {kind} takes: {takes}")


class SamplerSpec(Strict):
    """`sampler:` of a space: Optuna's sampler of that kind with these options (unset: its defaults)."""

    kind: Literal["tpe", "random", "grid", "gp", "cmaes", "qmc"] = "tpe"
    n_startup_trials: int | None = Field(None, ge=0, description="random trials before the model is used "
                                         "(tpe 20, gp 10, cmaes 1)")
    multivariate: bool | None = Field(None, description="tpe: one joint density over all params instead of one "
                                      "per param (default false)")
    group: bool | None = Field(None, description="tpe multivariate: a density per group of params that occur "
                               "together (conditional spaces)")
    constant_liar: bool | None = Field(None, description="tpe: running trials count as bad ones, so trials in "
                                       "flight together spread out (default true)")
    n_ei_candidates: int | None = Field(None, ge=1, description="tpe: candidates scored per proposal (default 24)")
    deterministic_objective: bool | None = Field(None, description="gp: no observation noise")
    sigma0: float | None = Field(None, gt=0, description="cmaes: initial step size")
    popsize: int | None = Field(None, ge=2, description="cmaes: population size")
    use_separable_cma: bool | None = None
    with_margin: bool | None = Field(None, description="cmaes: keep integer params from stalling")
    lr_adapt: bool | None = None
    qmc_type: Literal["sobol", "halton"] | None = None
    scramble: bool | None = Field(None, description="qmc: randomize the sequence with the space's seed")

    def options(self) -> dict[str, Any]:
        """The keyword arguments of this kind's Optuna sampler (TPE: autofl's defaults where unset)."""
        given = {name: getattr(self, name) for name in SAMPLER_OPTIONS[self.kind] if getattr(self, name) is not None}
        return {**TPE_DEFAULTS, **given} if self.kind == "tpe" else given


class SchedulerSpec(Strict):
    """`scheduler:` of a space: which Tune scheduler stops unpromising trials, by round."""

    kind: Literal["asha", "hyperband", "median", "none"] = "asha"
    grace_period: int = Field(1, ge=1, description="rounds every trial runs before it may be stopped")
    reduction_factor: float = Field(2.0, gt=1, description="asha/hyperband: 1/reduction_factor of the trials "
                                    "at a rung go on to the next")
    brackets: int = Field(3, ge=1, le=10, description="hyperband: brackets of different grace periods")
    min_samples_required: int = Field(3, ge=1, description="median: trials that must have reached a round "
                                      "before a trial is compared with them there")


def _all_params(space: "SearchSpace") -> dict[str, "ParamSpec"]:
    """Every param by its Optuna name, conditional ones as '<method>:<key>'."""
    from autofl.search.space import CONDITIONAL_SEP

    params = dict(space.params)
    for method, extra in space.conditional.items():
        params.update({f"{method}{CONDITIONAL_SEP}{key}": spec for key, spec in extra.items()})
    return params


def grid_values(spec: "ParamSpec") -> list[Any] | None:
    """The values a grid takes for `spec`, or None for a continuous range."""
    if spec.type == "categorical":
        return list(spec.choices or [])
    if spec.type == "int":
        return list(range(int(spec.low), int(spec.high) + 1, int(spec.step or 1)))  # type: ignore[arg-type]
    if spec.step is None:
        return None
    count = int(round((spec.high - spec.low) / spec.step))  # type: ignore[operator]
    return [round(spec.low + i * spec.step, 12) for i in range(count + 1)]  # type: ignore[operator]


def grid_size(space: "SearchSpace") -> int:
    size = 1
    for spec in _all_params(space).values():
        size *= len(grid_values(spec) or [])
    return size


def check_strategy(space: "SearchSpace") -> None:
    """The sampler and scheduler can run this space, or ValueError naming the field (one line)."""
    _only_own_options(space.sampler, SAMPLER_OPTIONS, "sampler")
    _only_own_options(space.scheduler, SCHEDULER_OPTIONS, "scheduler")
    if space.sampler.group and not space.sampler.multivariate:
        raise ValueError("sampler.group: needs multivariate: true")
    params = _all_params(space)
    kind = space.sampler.kind
    if space.multi_objective and space.scheduler.kind != "none":
        raise ValueError(f"scheduler.kind: {space.scheduler.kind!r} ranks trials by one metric; a multi-objective "
                         f"study needs scheduler: {{kind: none}}")
    if kind == "grid":
        for name, spec in params.items():
            if grid_values(spec) is None:
                raise ValueError(f"sampler.kind: grid needs discrete params, but {name} is a continuous float; "
                                 f"give it step: or choices:, or use kind tpe, random, gp, cmaes or qmc")
        if space.trials > grid_size(space):
            raise ValueError(f"trials: {space.trials} is more than the grid's {grid_size(space)} configs; allowed: "
                             f"1..{grid_size(space)} with sampler kind grid")
    if kind == "cmaes":
        if space.multi_objective:
            raise ValueError("sampler.kind: cmaes optimizes one objective; a multi-objective study takes kind tpe, "
                             "random, grid, gp or qmc")
        if all(spec.type == "categorical" for spec in params.values()):
            raise ValueError("sampler.kind: cmaes searches int and float params, and every param here is "
                             "categorical; use kind tpe, gp, random or grid")


def study_start_points(space: "SearchSpace") -> list[dict[str, Any]]:
    """The trials a new study runs first (the paper default, one per method in a cross-method
    study), except under a grid, which visits the default among its points anyway."""
    from autofl.search.space import start_points

    return [] if space.sampler.kind == "grid" else start_points(space)


def make_sampler(space: "SearchSpace"):
    """The Optuna sampler of `space.sampler`, seeded with the space's seed."""
    import optuna

    spec = space.sampler
    options = spec.options()
    if spec.kind == "tpe":
        return optuna.samplers.TPESampler(seed=space.seed, **options)
    if spec.kind == "random":
        return optuna.samplers.RandomSampler(seed=space.seed)
    if spec.kind == "grid":
        from autofl.search.grid_sampler import StudyGridSampler

        return StudyGridSampler({name: grid_values(p) for name, p in _all_params(space).items()}, seed=space.seed)
    if spec.kind == "gp":
        return optuna.samplers.GPSampler(seed=space.seed, **options)
    if spec.kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=space.seed, **options)
    return optuna.samplers.QMCSampler(seed=space.seed, **options)


def make_scheduler(space: "SearchSpace", ledger: "Ledger"):
    """The Tune scheduler of `space.scheduler` over FL rounds (None: every trial runs to the end)."""
    spec = space.scheduler
    if spec.kind == "none":
        return None
    if spec.kind == "median":
        from ray.tune.schedulers import MedianStoppingRule

        return MedianStoppingRule(time_attr="round", grace_period=spec.grace_period,
                                  min_samples_required=spec.min_samples_required)
    from autofl.search.scheduler import StudyASHA

    return StudyASHA(ledger, time_attr="round", max_t=space.max_rounds, grace_period=spec.grace_period,
                     reduction_factor=spec.reduction_factor, brackets=spec.brackets if spec.kind == "hyperband" else 1)

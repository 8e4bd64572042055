"""What a space file may say under `sampler:` and `scheduler:` (the pydantic sections, their
options per kind and autofl's TPE defaults). A leaf module: the space validates against it and
`autofl.tuning.strategy.build` builds the libraries' objects from it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from autofl.config import Strict

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
# TPE's settings where a space picks `kind: tpe` and leaves them unset: Optuna's, except 20 random
# trials before the model (Optuna: 10); on the search benchmark's tables (docs/search-quality.md)
# Optuna's 10 was worse than 20 on every task, and no TPE setting was at or below random
# search with ASHA at every budget of both Fashion-MNIST tables
TPE_DEFAULTS: dict[str, Any] = {
    "n_startup_trials": 20,
    "multivariate": False,
    "group": False,
    "constant_liar": True,
    "n_ei_candidates": 24,
}


def only_own_options(spec: Strict, owners: dict[str, tuple[str, ...]], section: str) -> None:
    kind = getattr(spec, "kind")  # noqa: B009 - each spec passed here has one; Strict does not declare it
    for name in sorted(spec.model_fields_set - {"kind", "skip_repeats"}):  # skip_repeats: every sampler kind
        if name not in owners[kind]:
            takes = ", ".join(owners[kind]) or "no options"
            users = ", ".join(k for k, opts in owners.items() if name in opts)
            raise ValueError(
                f"{section}.{name}: an option of kind {users}, not of {kind!r}; kind {kind} takes: {takes}"
            )


class SamplerSpec(Strict):
    """`sampler:` of a space: Optuna's sampler of that kind with these options (unset: its defaults)."""

    # the default, random search that skips configs already trained (with the default ASHA), met
    # issue 17's targets on three of the search benchmark's four tables and was never worse than
    # random search with ASHA there (docs/search-quality.md); a study keeps the defaults
    # it was created with (autofl.tuning.store.study)
    kind: Literal["tpe", "random", "grid", "gp", "cmaes", "qmc"] = "random"
    n_startup_trials: int | None = Field(
        None, ge=0, description="random trials before the model is used (tpe 20, gp 10, cmaes 1)"
    )
    multivariate: bool | None = Field(
        None, description="tpe: one joint density over all params instead of one per param (default false)"
    )
    group: bool | None = Field(
        None, description="tpe multivariate: a density per group of params that occur together (conditional spaces)"
    )
    constant_liar: bool | None = Field(
        None,
        description="tpe: running trials count as bad ones, so trials in flight together spread out (default true)",
    )
    n_ei_candidates: int | None = Field(None, ge=1, description="tpe: candidates scored per proposal (default 24)")
    deterministic_objective: bool | None = Field(None, description="gp: no observation noise")
    sigma0: float | None = Field(None, gt=0, description="cmaes: initial step size")
    popsize: int | None = Field(None, ge=2, description="cmaes: population size")
    use_separable_cma: bool | None = None
    with_margin: bool | None = Field(None, description="cmaes: keep integer params from stalling")
    lr_adapt: bool | None = None
    qmc_type: Literal["sobol", "halton"] | None = None
    scramble: bool | None = Field(None, description="qmc: randomize the sequence with the space's seed")
    skip_repeats: bool = Field(
        True,
        description="any kind: a proposed config that a finished trial already "
        "trained is told that trial's outcome instead of training again, and the sampler "
        "is asked again (matters on categorical or stepped spaces; false: train repeats; "
        "see docs/search-quality.md)",
    )

    def options(self) -> dict[str, Any]:
        """The keyword arguments of this kind's Optuna sampler (TPE: autofl's defaults where unset)."""
        given = {name: getattr(self, name) for name in SAMPLER_OPTIONS[self.kind] if getattr(self, name) is not None}
        return {**TPE_DEFAULTS, **given} if self.kind == "tpe" else given


class SchedulerSpec(Strict):
    """`scheduler:` of a space: which Tune scheduler stops unpromising trials, by round."""

    kind: Literal["asha", "hyperband", "median", "none"] = "asha"
    grace_period: int = Field(1, ge=1, description="rounds every trial runs before it may be stopped")
    reduction_factor: float = Field(
        2.0, gt=1, description="asha/hyperband: 1/reduction_factor of the trials at a rung go on to the next"
    )
    brackets: int = Field(3, ge=1, le=10, description="hyperband: brackets of different grace periods")
    min_samples_required: int = Field(
        3, ge=1, description="median: trials that must have reached a round before a trial is compared with them there"
    )

"""Search-space files: pydantic-validated, checked against the experiment config before Ray starts."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from autofl.config import TARGET_METRICS, Experiment, Strict, read_yaml, set_dotted, with_absolute_data_path
from autofl.errors import ConfigError, format_validation_error
from autofl.experiment import build_experiment
from autofl.methods.registry import get_method_class
from autofl.tuning.store.storage import check_storage_url

# any validation metric may be the objective: the mean, the worst-decile client (p10) or the spread
from autofl.tuning.strategy.constraints import CONSTRAINED_SAMPLERS, Constraint, parse_constraints
from autofl.tuning.strategy.objectives import DEFAULT_OBJECTIVE, VALIDATION_OBJECTIVES, default_mode, unsmoothed
from autofl.tuning.strategy.spec import SAMPLER_OPTIONS, SCHEDULER_OPTIONS, SamplerSpec, SchedulerSpec, only_own_options

CONDITIONAL_SEP = ":"  # optuna name of a conditional param: "<method>:<config key>"
# issue 42: sizes are counted, never listed, and bounded before any study exists. Optuna's GPSampler
# lists every value of a stepped param (8 bytes each) and its GridSampler every config of the grid
MAX_PARAM_VALUES = 1_000_000
# a study runs at most 100_000 trials (SearchSpace.trials), so a larger grid could never be visited
MAX_GRID_CONFIGS = 100_000


def value_count(spec: ParamSpec) -> int | None:
    """How many values a stepped or int param takes, computed (never listed); None for a
    continuous float, or for a categorical (its choices are already a list)."""
    if spec.type == "categorical" or (spec.type == "float" and spec.step is None):
        return None
    low, high = spec.low, spec.high
    if spec.type == "int":
        return (int(high) - int(low)) // int(spec.step or 1) + 1  # type: ignore[arg-type]
    ratio = (high - low) / spec.step  # type: ignore[operator]
    if not math.isfinite(ratio):
        return MAX_PARAM_VALUES * MAX_GRID_CONFIGS + 1  # more than any limit
    # low + i*step for i = 0..n with the last <= high (1e-9: a ratio like 2.9999999999 is 3)
    return math.floor(ratio + 1e-9) + 1


def _count_text(count: int) -> str:
    return str(count) if count < 10**15 else f"{count:.3g}"


class ParamSpec(Strict):
    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(None, gt=0)
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ParamSpec:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical needs a non-empty 'choices' list")
            return self
        if self.low is None or self.high is None:
            raise ValueError(f"{self.type} needs 'low' and 'high'")
        if self.low > self.high:
            raise ValueError(f"low must be <= high (got low={self.low:g}, high={self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0 (got {self.low:g})")
        if self.log and self.step is not None:
            raise ValueError("'log' and 'step' cannot be combined")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError("int bounds must be whole numbers")
        if self.type == "int" and self.step is not None and self.step != int(self.step):  # issue 18
            raise ValueError(f"an int step must be a whole number (got step={self.step:g})")
        count = value_count(self)
        if count is not None and count > MAX_PARAM_VALUES:  # issue 42: a sampler (gp) lists every value
            how = "a larger step" + (", or no step (a continuous range)" if self.type == "float" else "")
            raise ValueError(
                f"{_count_text(count)} values from low={self.low:g} to high={self.high:g} in steps of "
                f"{self.step or 1:g}; allowed: at most {MAX_PARAM_VALUES} values per param ({how})"
            )
        return self

    def contains(self, value: Any) -> bool:
        if self.type == "categorical":
            return value in (self.choices or [])
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return self.low <= value <= self.high  # type: ignore[operator]

    def example(self) -> Any:
        return self.choices[0] if self.type == "categorical" else (int(self.low) if self.type == "int" else self.low)  # type: ignore[index,arg-type]


class ResourcesSpec(Strict):
    cpu: float = Field(1.0, gt=0)
    gpu: float | Literal["auto"] = Field(
        0.0,
        description="fractional values share a GPU between trials; "
        "auto: as many trials per GPU as a dry round's peak memory allows "
        "(0 without a GPU; see autofl/tuning/tune/gpu_packing.py)",
    )
    _auto_line: str | None = PrivateAttr(None)  # what `gpu: auto` resolved to and why

    @field_validator("gpu", mode="before")
    @classmethod
    def _share_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError("allowed: auto, or a share of a GPU >= 0 such as 0.25")
        return float(value)

    @property
    def auto_line(self) -> str | None:
        """What `gpu: auto` and `population: auto` resolved to and why (None when neither was auto)."""
        lines = [line for line in (self._auto_line, self._population_line) if line]
        return "; ".join(lines) or None

    @property
    def gpu_share(self) -> float:
        """`gpu` as a number, once `SearchSpace.resolve_resources` has resolved `auto`."""
        if self.gpu == "auto":
            raise RuntimeError("resources.gpu: auto is not resolved yet (call SearchSpace.resolve_resources first)")
        return self.gpu

    max_concurrent: int | None = Field(
        None,
        ge=1,
        description="trials in flight at once; default: as many as the cluster holds when the run "
        "starts (set it higher on an autoscaling cluster)",
    )
    population: int | Literal["auto"] = Field(
        1,
        description="configs one trial trains together as one batched model (population trials, "
        "autofl/tuning/strategy/cohorts.py): they share every value that is not fusible; each is its "
        "own Optuna trial, judged by ASHA on its own; 1: one config per trial; auto: the widest of 1, 2, 4, ... "
        "whose dry round ran at least 15% more config-rounds per second than the width before it "
        "(autofl/tuning/tune/population_width.py)",
    )
    _population_line: str | None = PrivateAttr(None)  # what `population: auto` resolved to and why

    @field_validator("population", mode="before")
    @classmethod
    def _width_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("allowed: auto, or a whole number of configs per trial >= 1 (1: one config per trial)")
        return value

    @property
    def population_measured(self) -> bool:
        """Whether `population` was `auto` (resolved by a measurement, or kept from the study's first run)."""
        return self._population_line is not None

    @property
    def population_width(self) -> int:
        """`population` as a number, once `SearchSpace.resolve_resources` has resolved `auto`."""
        if self.population == "auto":
            raise RuntimeError(
                "resources.population: auto is not resolved yet (call SearchSpace.resolve_resources first)"
            )
        return self.population


class SearchSpace(Strict):
    study: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    base: dict[str, Any] = Field(default_factory=dict, description="an experiment config, as for autofl train")
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    conditional: dict[str, dict[str, ParamSpec]] = Field(
        default_factory=dict, description="method name -> params searched only when method.name is that method"
    )
    method_base: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="method name -> config overlay on base when that method runs (its paper "
        "fl and method settings); rounds and data stay the study's, so methods compare on equal terms",
    )
    objective: str = Field(
        DEFAULT_OBJECTIVE,
        description="the validation metric the study optimizes; the default, each trial's mean personal "
        "validation accuracy over its last 3 evaluated rounds, ranks configs less by one round's noise "
        "(docs/search-quality.md)",
    )
    mode: Literal["max", "min"] = "max"
    objectives: list[str] | None = Field(
        None, description="2 or more validation metrics: a multi-objective study (a Pareto front; scheduler none)"
    )
    modes: list[Literal["max", "min"]] | None = Field(
        None, description="one per objective; default max, and min for a spread (*_std)"
    )
    constraints: list[str] = Field(
        default_factory=list,
        description="'<metric> >= <number>' or '<metric> <= <number>' on reported metrics "
        "(not test metrics); infeasible trials are never the best (sampler kind tpe or gp)",
    )
    trials: int = Field(20, ge=1, le=100_000)
    time_budget_s: float | None = Field(
        None,
        gt=0,
        description="wall seconds per driver run; then its trials "
        "in flight are stopped (recorded PRUNED) and no new one starts",
    )
    budget_rounds: int | None = Field(
        None,
        ge=1,
        description="FL rounds trained by all the study's trials "
        "together; once reached, trials in flight stop (PRUNED), none starts",
    )
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    storage: str | None = Field(
        None,
        description="sqlite:////PATH.db, postgresql+psycopg://USER@HOST:PORT/DB, "
        "journal:///PATH.log or journal://NAME.log (a file in the study folder, for a "
        "shared filesystem); default: sqlite file in the study folder",
    )
    storage_path: str | None = Field(
        None,
        description="where Tune keeps experiments and trial checkpoints "
        "(default: the study folder); on a multi-node cluster a folder or URI "
        "(s3://, gs://) every node reaches",
    )
    checkpoint_every_s: float = Field(
        30.0,
        ge=0,
        description="a trial checkpoints once this much training is "
        "unsaved (0: every evaluated round), and at its end; it keeps its last 2 (all, under 4 s)",
    )
    max_failures: int = Field(
        2,
        ge=0,
        le=100,
        description="a trial whose worker dies (killed, out of memory, a "
        "lost node) restarts from its last checkpoint up to this many times",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the sampler's seed")
    start_from_base: bool = Field(True, description="first trial = the base config's values (the paper default)")

    @field_validator("base")
    @classmethod
    def _absolute_data_path(cls, base: dict[str, Any]) -> dict[str, Any]:
        return with_absolute_data_path(base)  # the trials' workers run in other folders

    @field_validator("storage")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        return None if value is None else check_storage_url(value, None)

    @model_validator(mode="after")
    def _target_follows_objective(self) -> SearchSpace:
        """With `base.eval.target_acc` set and no `target_metric`, rounds_to_target watches the study's
        (first) objective when it is an accuracy to reach (not a spread): written into base, so every
        trial, re-evaluation and exported config reads the same."""
        evaluation = self.base.get("eval")
        if (
            isinstance(evaluation, dict)
            and evaluation.get("target_acc") is not None
            and "target_metric" not in evaluation
            and unsmoothed(first := (self.objectives or [self.objective])[0]) in TARGET_METRICS
        ):  # a smoothed objective's accuracy to reach is its metric's own (personal_val_acc for _last3)
            self.base = {**self.base, "eval": {**evaluation, "target_metric": unsmoothed(first)}}
        return self

    @model_validator(mode="after")
    def _objective_is_validation(self) -> SearchSpace:
        if self.objectives is not None:
            self._multi_objective()
        for i, name in enumerate(self.objectives or [self.objective]):
            field = f"objectives[{i}]" if self.objectives else "objective"
            if name not in VALIDATION_OBJECTIVES:
                raise ValueError(
                    f"{field}: {name!r} is not a validation metric; allowed: "
                    f"{', '.join(VALIDATION_OBJECTIVES)} (test metrics are reported, never optimized)"
                )
        if self.conditional and "method.name" not in self.params:
            raise ValueError("conditional: needs method.name among params (conditional params follow the method)")
        parse_constraints(self.constraints)
        check_strategy(self)
        return self

    def _multi_objective(self) -> None:
        """`objectives` given: 2+ distinct names, one mode each; `objective`/`mode` become the first
        (what single-metric displays show); ASHA cannot rank trials on several metrics."""
        names = self.objectives or []
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(
                f"objectives: {names} must name 2 or more different validation metrics; for one, use objective:"
            )
        if self.modes is None:
            self.modes = [default_mode(n) for n in names]
        if len(self.modes) != len(names):
            raise ValueError(f"modes: {len(self.modes)} given for {len(names)} objectives; allowed: one per objective")
        self.objective, self.mode = names[0], self.modes[0]

    @property
    def metrics(self) -> list[str]:
        """The optimized metrics: `objectives`, or the one `objective`."""
        return list(self.objectives or [self.objective])

    @property
    def multi_objective(self) -> bool:
        return self.objectives is not None

    def resolve_resources(
        self, recorded_population: int | None = None, population: bool = True, trials: int | None = None
    ) -> SearchSpace:
        """The explicit step a driver takes once before it runs trials (parsing measures nothing):
        `resources.population: auto` becomes the width a dry round chose (autofl/tuning/tune/population_width.py),
        or `recorded_population`, the width the study's first run measured (not with `population`
        False: a re-evaluation reads the recorded width itself); its cap counts `trials` (the run's,
        e.g. `--trials`; default the space's), and then `resources.gpu: auto` the share
        of a card one trial of that width needs, measured on a dry round of the base experiment (0 without
        a GPU; autofl/tuning/tune/gpu_packing.py). Idempotent."""
        if self.resources.population == "auto" and recorded_population:
            self.resources.population = recorded_population
            self.resources._population_line = (
                f"resources.population: auto = {recorded_population}: as this study's first run measured "
                "(kept, so that a resumed or extended study forms the cohorts it did)"
            )
        if self.resources.population == "auto" and population:  # first: a GPU share is sized for the width
            from autofl.device import resolve_device  # lazy: pulls torch
            from autofl.tuning.tune.gpu_packing import concurrent_trials, machine_cpus  # lazy: pulls torch
            from autofl.tuning.tune.population_width import resolve_auto_population  # lazy: pulls torch

            slots = concurrent_trials(machine_cpus(), self.resources.cpu, self.resources.max_concurrent) or 1
            on_gpu = self.resources.gpu == "auto" or self.resources.gpu > 0
            device = resolve_device("auto" if on_gpu else "cpu")  # where the trials will train
            self.resources.population, self.resources._population_line = resolve_auto_population(
                self.base_experiment(), trials or self.trials, slots, max(1, int(self.resources.cpu)), device
            )
        if self.resources.gpu == "auto":
            from autofl.tuning.tune.gpu_packing import resolve_auto_gpu  # lazy: pulls torch

            width = self.resources.population if isinstance(self.resources.population, int) else 1
            self.resources.gpu, self.resources._auto_line = resolve_auto_gpu(
                self.base_experiment(), self.resources.cpu, self.resources.max_concurrent, width
            )
        return self

    @property
    def parsed_constraints(self) -> list[Constraint]:
        """The space's `constraints`, parsed (validated when the space was)."""
        return parse_constraints(self.constraints)

    def base_experiment(self) -> Experiment:
        return build_experiment(self.base)

    def config(self, values: dict[str, Any]) -> dict[str, Any]:
        """The experiment config of one trial's searched values."""
        return experiment_dict(self.base, values, self.method_base)

    @property
    def max_rounds(self) -> int:
        return self.base_experiment().fl.rounds


def experiment_dict(
    base: dict[str, Any], values: dict[str, Any], method_base: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The base config, with the chosen method's `method_base` overlay, with searched values set
    (keys may carry a '<method>:' prefix)."""
    tree = copy.deepcopy(base)
    method = values.get("method.name", (base.get("method") or {}).get("name"))
    _merge(tree, copy.deepcopy((method_base or {}).get(str(method), {})))
    for key, value in values.items():
        set_dotted(tree, key.split(CONDITIONAL_SEP, 1)[-1], value)
    return tree


def _merge(tree: dict[str, Any], overlay: dict[str, Any]) -> None:
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = value


def _named_param(message: str, paths: dict[str, str]) -> str | None:
    """The searched key a build error is about: the one whose config key starts the message's path
    (`fl.learning_rate: unknown key` is about the param fl.learning_rate), else None."""
    head = message.split(":", 1)[0].strip()
    named = [key for key in paths if head == _config_key(key) or head.startswith(_config_key(key) + ".")]
    return max(named, key=len) if named else None


def _config_key(key: str) -> str:
    return key.split(CONDITIONAL_SEP, 1)[-1]


def _check_keys(
    space: SearchSpace, method: str | None, params: dict[str, ParamSpec], paths: dict[str, str], where: str
) -> None:
    """Build the experiment with each param's example value: unknown keys and bad methods fail here.
    `paths[key]` is where the space file declares `key` (params.<key> or conditional.<method>.<key>):
    an error is reported under the param it is about, not under the one being checked when it came."""
    values = {k: p.example() for k, p in params.items()}

    def build(point: dict[str, Any], key: str, what: str) -> None:
        try:
            build_experiment(space.config(point))
        except ConfigError as err:
            culprit = _named_param(str(err), paths)
            if culprit is not None and culprit != key:  # another param's value broke it: name that one
                raise ConfigError(f"{paths[culprit]}: {err}") from None
            raise ConfigError(f"{paths.get(key, f'{where}.{key}')}: {what.format(err=err)}") from None

    if method is not None:
        values["method.name"] = method
        build(values, "method.name", f"choice {method!r} is invalid ({{err}})")
    for key, spec in params.items():
        build({**values, key: spec.example()}, key, "{err}")
        if spec.type != "categorical":  # both ends of the range must make a valid config
            high = int(spec.high) if spec.type == "int" else spec.high  # type: ignore[arg-type]
            build({**values, key: high}, key, f"high={high!r} is invalid ({{err}})")
            continue
        for choice in spec.choices or []:  # every choice (e.g. each method name) must make a valid config
            build({**values, key: choice}, key, f"choice {choice!r} is invalid ({{err}})")


def _check_target_metrics(space: SearchSpace, base_target: str) -> None:
    """Every `eval.target_metric` a trial could run with (the base's, a method's overlay, a searched or
    conditional choice) is a validation metric: a search reads no test split, so a test metric's
    `rounds_to_target` would never be reported. Checked where a space is made, not where a stored one
    is read (an older study's space stays readable)."""
    found: list[tuple[str, Any]] = [("base.eval.target_metric", base_target)]
    for method, overlay in space.method_base.items():
        evaluation = overlay.get("eval")
        if isinstance(evaluation, dict) and "target_metric" in evaluation:
            found.append((f"method_base.{method}.eval.target_metric", evaluation["target_metric"]))
    searched = [("params.eval.target_metric", space.params.get("eval.target_metric"))] + [
        (f"conditional.{m}.eval.target_metric", own.get("eval.target_metric")) for m, own in space.conditional.items()
    ]
    for field, spec in searched:
        if spec is not None:
            found.extend((field, choice) for choice in spec.choices or [])
    allowed = ", ".join(m for m in TARGET_METRICS if m in VALIDATION_OBJECTIVES)
    for field, target in found:
        if target not in VALIDATION_OBJECTIVES:
            raise ConfigError(
                f"{field}: {target!r} reads the test split, which a search never reads; allowed: {allowed}"
            )


def validate_space(space: SearchSpace) -> None:
    try:
        base = space.base_experiment()
    except ConfigError as err:
        raise ConfigError(f"base.{err}") from None
    rounds = base.fl.rounds  # the schedulers' max_t: a trial's rounds
    if space.scheduler.kind != "none" and space.scheduler.grace_period > rounds:
        raise ConfigError(
            f"scheduler.grace_period: {space.scheduler.grace_period} is more than the {rounds} rounds "
            f"a trial runs (base fl.rounds), so no trial would ever be stopped; allowed: 1..{rounds}, "
            f"or scheduler: {{kind: none}} to run every trial to the end"
        )
    searched = "method.name" in space.params
    choices = (space.params["method.name"].choices or []) if searched else [base.method.name]
    methods = [str(m) for m in choices]  # the methods this study runs
    if searched:
        shared = {k: v for k, v in space.params.items() if k != "method.name"}
        for method in choices:
            own = space.conditional.get(str(method), {})
            paths = {
                "method.name": "params.method.name",
                **{k: f"params.{k}" for k in shared},
                **{k: f"conditional.{method}.{k}" for k in own},
            }
            _check_keys(space, method, {**shared, **own}, paths, "params")
        unknown = set(space.conditional) - set(methods)
        if unknown:
            raise ConfigError(
                f"conditional.{sorted(unknown)[0]}: not among method.name choices; allowed: {', '.join(methods)}"
            )
    else:
        _check_keys(space, None, space.params, {k: f"params.{k}" for k in space.params}, "params")
    for method, overlay in space.method_base.items():
        if method not in methods:
            raise ConfigError(f"method_base.{method}: not a method this study runs; allowed: {', '.join(methods)}")
        fixed = [k for k in ("data", "seed") if k in overlay] + (
            ["fl.rounds"] if "rounds" in overlay.get("fl", {}) else []
        )
        if fixed:
            raise ConfigError(
                f"method_base.{method}.{fixed[0]}: the study's own for every method (equal data and "
                f"rounds); allowed: fl (but rounds), model, method, runtime"
            )
    _check_target_metrics(space, base.eval.target_metric)
    val_spec = space.params.get("data.split.val")
    if base.data.split.val == 0 or (val_spec is not None and val_spec.example() == 0):
        raise ConfigError(
            f"objective: {space.objective} needs validation samples, but data.split.val can be 0; "
            f"allowed: data.split.val > 0 (the test split is reported, never optimized)"
        )
    if not base.eval.global_metrics:
        wanted = [("objective", m) for m in space.metrics if m.startswith("global_")]
        wanted += [("constraints", c.metric) for c in space.parsed_constraints if c.metric.startswith("global_")]
        if wanted:
            field, metric = wanted[0]
            raise ConfigError(
                f"{field}: {metric} is not computed with base.eval.global_metrics false; "
                f"allowed: {', '.join(o for o in VALIDATION_OBJECTIVES if not o.startswith('global_'))}"
            )
    global_objective = next((m for m in space.metrics if m.startswith("global_val_acc")), None)
    if global_objective is not None:
        for m in methods:
            if not get_method_class(m).has_global_model:
                raise ConfigError(
                    f"objective: method {m} has no global model, so {global_objective} is undefined; "
                    f"allowed: {', '.join(o for o in VALIDATION_OBJECTIVES if not o.startswith('global_'))}"
                )
    if "data.holdout_clients" not in space.params and not base.data.holdout_count():
        unseen = [m for m in space.metrics if m.startswith("unseen_")]
        unseen += [c.metric for c in space.parsed_constraints if c.metric.startswith("unseen_")]
        if unseen:
            raise ConfigError(
                f"{'objective' if unseen[0] in space.metrics else 'constraints'}: {unseen[0]} needs clients held "
                f"out of training, but base data.holdout_clients is 0; allowed: data.holdout_clients > 0 "
                f"(a count or a fraction), or a personal_* metric"
            )
    for i, constraint in enumerate(space.parsed_constraints):
        if constraint.metric.startswith("global_"):
            for m in methods:
                if not get_method_class(m).has_global_model:
                    raise ConfigError(
                        f"constraints[{i}]: method {m} has no global model, so {constraint.metric} is "
                        f"undefined; allowed: a personal_* metric or train_loss"
                    )


def load_space(path: str | Path) -> SearchSpace:
    return parse_space(read_yaml(path), path)


def parse_space(raw: dict[str, Any], where: str | Path) -> SearchSpace:
    """The validated space of `raw` (a file's mapping, or a dict from Python); errors name `where`."""
    try:
        space = SearchSpace.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{where}: {format_validation_error(err, SearchSpace)}") from None
    try:
        validate_space(space)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    return space


def parse_stored_space(raw: dict[str, Any], where: str | Path) -> SearchSpace:
    """A study's own space file, checked as a SearchSpace (keys, types, sampler and scheduler)
    without building its experiments (`validate_space`, done when the study was made and again
    before any work): what read-only views need."""
    try:
        return SearchSpace.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{where}: {format_validation_error(err, SearchSpace)}") from None


def _lookup(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def initial_point(space: SearchSpace) -> dict[str, Any] | None:
    """The base config's value of every searched key (the paper default), if all lie in their ranges."""
    if not space.start_from_base or "method.name" in space.params:
        return None
    resolved = space.base_experiment().model_dump()
    point = {}
    for key, spec in space.params.items():
        value = _lookup(resolved, key)
        if value is None or not spec.contains(value):
            return None
        point[key] = value
    return point


def method_default_points(space: SearchSpace) -> list[dict[str, Any]]:
    """A cross-method study's first trials: per method choice, its paper default (base plus its
    `method_base` overlay) for every searched key whose default lies in range; Optuna samples the rest."""
    if not space.start_from_base or "method.name" not in space.params:
        return []
    points = []
    for method in space.params["method.name"].choices or []:
        resolved = build_experiment(space.config({"method.name": method})).model_dump()
        point: dict[str, Any] = {"method.name": method}
        keys = [(k, k, spec) for k, spec in space.params.items() if k != "method.name"]
        keys += [
            (f"{method}{CONDITIONAL_SEP}{k}", k, spec) for k, spec in space.conditional.get(str(method), {}).items()
        ]
        for name, key, spec in keys:
            value = _lookup(resolved, key)
            if value is not None and spec.contains(value):
                point[name] = value
        points.append(point)
    return points


def start_points(space: SearchSpace) -> list[dict[str, Any]]:
    """What a new study runs first: the paper default, or one per method in a cross-method study."""
    point = initial_point(space)
    return [point] if point is not None else method_default_points(space)


def suggest(trial: Any, name: str, spec: ParamSpec) -> Any:
    if spec.type == "categorical":
        return trial.suggest_categorical(name, spec.choices)
    if spec.type == "int":
        return trial.suggest_int(name, int(spec.low), int(spec.high), step=int(spec.step or 1), log=spec.log)  # type: ignore[arg-type]
    return trial.suggest_float(name, spec.low, spec.high, step=spec.step, log=spec.log)


class DefineByRun:
    """Optuna define-by-run space (picklable, so Tune can save the searcher): shared params first,
    then the chosen method's conditional params."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def __call__(self, trial: Any) -> None:
        chosen = {key: suggest(trial, key, spec) for key, spec in self.space.params.items()}
        method = chosen.get("method.name")
        for key, spec in self.space.conditional.get(str(method), {}).items():
            suggest(trial, f"{method}{CONDITIONAL_SEP}{key}", spec)
        return None


# which samplers can run this space (sampler:, scheduler: sections: autofl.tuning.strategy.spec)
def all_params(space: SearchSpace) -> dict[str, ParamSpec]:
    """Every param by its Optuna name, conditional ones as '<method>:<key>'."""
    params = dict(space.params)
    for method, extra in space.conditional.items():
        params.update({f"{method}{CONDITIONAL_SEP}{key}": spec for key, spec in extra.items()})
    return params


def grid_values(spec: ParamSpec) -> list[Any] | None:
    """The values a grid takes for `spec`, or None for a continuous range (only for a grid that
    check_strategy accepted: at most MAX_GRID_CONFIGS configs)."""
    if spec.type == "categorical":
        return list(spec.choices or [])
    count = value_count(spec)
    if count is None:
        return None
    if spec.type == "int":
        return list(range(int(spec.low), int(spec.high) + 1, int(spec.step or 1)))  # type: ignore[arg-type]
    return [round(spec.low + i * spec.step, 12) for i in range(count)]  # type: ignore[operator]


def grid_count(spec: ParamSpec) -> int:
    """The values a grid takes for `spec` (0 for a continuous range), counted, not listed."""
    if spec.type == "categorical":
        return len(spec.choices or [])
    return value_count(spec) or 0


def grid_size(space: SearchSpace) -> int:
    """The configs of the space's grid (0 if a param is continuous): a product of counts."""
    size = 1
    for spec in all_params(space).values():
        size *= grid_count(spec)
    return size


def check_strategy(space: SearchSpace) -> None:
    """The sampler and scheduler can run this space, or ValueError naming the field (one line)."""
    only_own_options(space.sampler, SAMPLER_OPTIONS, "sampler")
    only_own_options(space.scheduler, SCHEDULER_OPTIONS, "scheduler")
    if space.sampler.group and not space.sampler.multivariate:
        raise ValueError("sampler.group: needs multivariate: true")
    params = all_params(space)
    kind = space.sampler.kind
    if space.constraints and kind not in CONSTRAINED_SAMPLERS:
        raise ValueError(
            f"constraints: sampler kind {kind} ignores constraints; allowed: sampler kind "
            f"{' or '.join(CONSTRAINED_SAMPLERS)} (Optuna's samplers that model them), or no constraints"
        )
    if space.resources.population != 1 and space.sampler.kind == "grid":
        raise ValueError(
            "sampler.kind: grid hands each trial one whole grid point, and the configs of a trial of "
            "resources.population > 1 (or auto) share their non-fusible values; allowed with a population: "
            "tpe, random, gp, cmaes or qmc (or resources.population: 1)"
        )
    if space.resources.population != 1 and space.scheduler.kind == "median":
        raise ValueError(
            "scheduler.kind: median stops whole trials, and a trial of resources.population > 1 (or auto) "
            "trains several configs; allowed with a population: asha, hyperband or none"
        )
    if space.multi_objective and space.scheduler.kind != "none":
        raise ValueError(
            f"scheduler.kind: {space.scheduler.kind!r} ranks trials by one metric; a multi-objective "
            f"study needs scheduler: {{kind: none}}"
        )
    if kind == "grid":
        for name, spec in params.items():
            if grid_values(spec) is None:
                raise ValueError(
                    f"sampler.kind: grid needs discrete params, but {name} is a continuous float; "
                    f"give it step: or choices:, or use kind tpe, random, gp, cmaes or qmc"
                )
        size = grid_size(space)
        if size > MAX_GRID_CONFIGS:
            widest = max(params, key=lambda name: grid_count(params[name]))
            raise ValueError(
                f"sampler.kind: grid over {_count_text(size)} configs ({widest} alone takes "
                f"{grid_count(params[widest])} values); allowed: at most {MAX_GRID_CONFIGS} configs "
                f"(larger steps or fewer choices, or kind random, tpe, gp, cmaes or qmc)"
            )
        if space.trials > size:
            raise ValueError(
                f"trials: {space.trials} is more than the grid's {size} configs; allowed: "
                f"1..{size} with sampler kind grid"
            )
    if kind == "cmaes":
        if space.multi_objective:
            raise ValueError(
                "sampler.kind: cmaes optimizes one objective; a multi-objective study takes kind tpe, "
                "random, grid, gp or qmc"
            )
        if all(spec.type == "categorical" for spec in params.values()):
            raise ValueError(
                "sampler.kind: cmaes searches int and float params, and every param here is "
                "categorical; use kind tpe, gp, random or grid"
            )

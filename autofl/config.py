"""The experiment config: one pydantic model, loaded from YAML with `--set key=value` overrides.

This module knows no method; `autofl.experiment` builds an experiment and lets its method check
its own parameters.

Every field has a default, so an empty file is a valid experiment (digits, mlp, fedavg).
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autofl.errors import ConfigError, format_validation_error
from autofl.registry import DATASETS, MODELS, REGISTRIES
from autofl.safe_yaml import YamlTooLarge, load_text, read_text_bounded

DATA_ROOT_ENV = "AUTOFL_DATA_ROOT"


# `json_schema_extra` of a field whose value changes no shape, no step count and no Python control
# flow: members of one population (autofl.population) may differ in it (`fusible_fields`)
FUSIBLE: dict[str, Any] = {"fusible": True}


def fusible_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `model` declared fusible (`Field(..., json_schema_extra=FUSIBLE)`), in field order."""
    return tuple(
        name
        for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("fusible") is True
    )


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """`true`/`false` only where a field takes a boolean (pydantic read `fl.rounds=true` as 1)."""
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation is not bool and bool not in get_args(annotation) and annotation is not Any:
                raise ValueError(f"{str(value).lower()} is a boolean; this field takes a number or a name")
        return value


class PartitionConfig(Strict):
    kind: Literal["iid", "dirichlet", "pathological", "natural"] = Field(
        "dirichlet", description="natural: the dataset's own client ids (e.g. the npz file's `client` array)"
    )
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (dirichlet only)")
    classes_per_client: int = Field(2, ge=1, description="k of pathological(k)")
    class_order: Literal["shuffled", "in_order"] = Field(
        "shuffled",
        description="pathological: which k classes a client holds: k consecutive classes of a seeded "
        "shuffle of the labels, or of the labels in order (PFLlib's protocol, e.g. FedFCD's Table 1: clients hold "
        "{0,1}, {2,3}, ...)",
    )


class SplitConfig(Strict):
    train: float = Field(0.7, gt=0, le=1)
    val: float = Field(0.1, ge=0, lt=1)
    test: float = Field(0.2, ge=0, lt=1)

    @model_validator(mode="after")
    def _sums_to_one(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"train + val + test must sum to 1 (got {total:g})")
        return self


def _registered(registry_name: str, name: str) -> str:
    """`name` if the registry holds it, else the one line listing what it holds."""
    registry = REGISTRIES[registry_name]
    if name not in registry:
        raise ValueError(registry.unknown(name))
    return name


def absolute_path(path: str) -> str:
    """`path` (~ expanded) as an absolute path from this process's folder: a trial's worker runs
    in another folder, so a relative `data.path` is fixed where the config is read (issue 42)."""
    return os.path.abspath(os.path.expanduser(path)) if path else path


def with_absolute_data_path(tree: Any) -> Any:
    """A config mapping (a space's `base`) with a relative `data.path` and `data.root` made absolute
    (see absolute_path): the trials' workers run in other folders."""
    data = tree.get("data") if isinstance(tree, dict) else None
    if not isinstance(data, dict):
        return tree
    fixed = {key: absolute_path(data[key]) for key in ("path", "root") if isinstance(data.get(key), str) and data[key]}
    return {**tree, "data": {**data, **fixed}} if fixed else tree


class DataConfig(Strict):
    dataset: str = Field("digits", description="a registered dataset (autofl list datasets)")
    root: str | None = Field(None, description=f"dataset folder; default ${DATA_ROOT_ENV} or ./data")
    path: str | None = Field(None, description="the file a dataset reads (npz: the .npz archive)")
    download: bool = False
    pool: Literal["train", "train+test"] = "train"
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    num_clients: int = Field(10, ge=1)
    split: SplitConfig = Field(default_factory=SplitConfig)
    min_size: int = Field(10, ge=0, description="dirichlet: fewest samples a client may hold")
    holdout_clients: float = Field(
        0,
        ge=0,
        allow_inf_nan=False,
        description="clients kept out of training altogether and tested as newcomers (unseen_* metrics): "
        "a count, or a fraction of num_clients below 1 (at least one client); 0: none",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=2**32 - 1,
        description="seed of the partition and split; None: the "
        "experiment's seed (re-evaluation over fresh seeds keeps the partition by fixing it)",
    )

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        return _registered("datasets", name)

    @field_validator("path", "root")
    @classmethod
    def _absolute_path(cls, path: str | None) -> str | None:
        return None if path is None else absolute_path(path)

    @field_validator("holdout_clients")
    @classmethod
    def _count_or_fraction(cls, value: float) -> float:
        if value >= 1 and not value.is_integer():
            raise ValueError(
                f"{value:g} is neither a count nor a fraction; allowed: a count (0, 1, 2 ...) or a fraction "
                "of num_clients below 1"
            )
        return value

    def holdout_count(self) -> int:
        """How many of the num_clients clients are held out: a count (1 or more), or a fraction (below 1)
        of num_clients rounded half up, to at least 1."""
        value = self.holdout_clients
        if value >= 1:
            return int(value)
        return max(1, math.floor(value * self.num_clients + 0.5)) if value > 0 else 0

    def training_clients(self) -> int:
        """The clients that take part in training: num_clients less the held-out ones."""
        return self.num_clients - self.holdout_count()

    def resolved_root(self) -> Path:
        return Path(self.root or os.environ.get(DATA_ROOT_ENV) or "data").expanduser()


class ModelConfig(BaseModel):
    """The arch plus its split; any other key is a parameter of the arch's own (validated by its
    `ModelSpec.Params` in `Experiment`, like a method's)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    arch: str = Field("mlp", description="a registered model (autofl list models)")
    head_layers: int = Field(1, ge=1, description="trailing Linear layers that form the head")
    projector_depth: int | None = Field(None, ge=0, le=8, description="None: the method's default")
    projector_dim: int | None = Field(None, ge=1, description="projector hidden width; None: 256")

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, name: str) -> str:
        return _registered("models", name)

    def params(self) -> dict[str, Any]:
        """The arch's own parameters (every key but the split's)."""
        return dict(self.model_extra or {})


class FLConfig(Strict):
    # upper bounds are sanity limits: a typo such as rounds=10**12 is an error, not a run that never ends
    rounds: int = Field(20, ge=1, le=100_000)
    participation: float = Field(1.0, gt=0, le=1)
    local_epochs: int = Field(1, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=100_000)
    lr: float = Field(
        0.05, gt=0, le=1e4, json_schema_extra=FUSIBLE
    )  # larger is a typo (1e4 already diverges to NaN in a few rounds)
    momentum: float = Field(0.9, ge=0, lt=1, json_schema_extra=FUSIBLE)
    weight_decay: float = Field(0.0, ge=0, le=1, json_schema_extra=FUSIBLE)
    lr_decay: float = Field(1.0, gt=0, le=1, json_schema_extra=FUSIBLE)
    eval_every: int = Field(1, ge=1, le=100_000)


# metrics that grow as a run learns: what `eval.target_metric` may name
TARGET_METRICS = (
    "personal_val_acc",
    "personal_val_acc_p10",
    "global_val_acc",
    "unseen_val_acc",
    "personal_test_acc",
    "personal_test_acc_p10",
    "global_test_acc",
    "unseen_test_acc",
)


class EvalConfig(Strict):
    target_acc: float | None = Field(
        None,
        gt=0,
        le=1,
        description="rounds_to_target: the first evaluated round whose target_metric reaches this accuracy; "
        "None: not reported",
    )
    target_metric: Literal[TARGET_METRICS] = Field(  # type: ignore[valid-type]
        "personal_val_acc", description="the accuracy rounds_to_target watches"
    )
    harmed_clients: bool = Field(
        False,
        description="report harmed_frac and harmed_vs_global: the share of clients whose personal test accuracy "
        "is below their own training alone (the local method) / the FedAvg global model, references computed "
        "once per partition and seed (a study caches them in its folder)",
    )
    global_metrics: bool = Field(
        True,
        description="global_val_acc and global_test_acc at every evaluated round (the global model on every "
        "client's validation split and on the official test set); false: not computed, which saves those forward "
        "passes in a study of personal metrics",
    )
    newcomer_epochs: int = Field(
        1,
        ge=0,
        le=1000,
        description="data.holdout_clients: the local epochs a held-out client trains, the method's own "
        "local step from the global model, before it is tested; 0: tested on the global model as received",
    )


ParamsT = TypeVar("ParamsT", bound=BaseModel)


class MethodConfig(BaseModel):
    """`name` plus the method's own parameters, validated by that method's pydantic model
    (`Method.resolve_experiment`), which it then carries typed (`typed`)."""

    model_config = ConfigDict(extra="allow")
    name: str = "fedavg"
    # the method's validated Params, as resolve_experiment made them (kept through copies and pickles;
    # a config read back from YAML or a dict is validated again, once, by `typed`)
    _typed: BaseModel | None = PrivateAttr(None)

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def __eq__(self, other: object) -> bool:
        """Equal when the name and the parameters are: the carried typed Params are a cache, so a
        resolved experiment equals the same values read back from YAML."""
        if not isinstance(other, MethodConfig):
            return NotImplemented
        return self.name == other.name and self.params() == other.params()

    def carry(self, typed: BaseModel) -> MethodConfig:
        """Keep `typed`, the method's validated Params of exactly these values."""
        self._typed = typed
        return self

    def typed(self, params_cls: type[ParamsT]) -> ParamsT:
        """The method's parameters as its `Params` model: the one validated when the experiment was
        resolved while its values are these (an override written after it is validated, once)."""
        if not (isinstance(self._typed, params_cls) and self._typed.model_dump() == self.params()):
            self._typed = params_cls(**self.params())
        return self._typed


class RuntimeConfig(Strict):
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto, cpu, cuda, cuda:N")
    threads: int | None = Field(
        None, ge=1, le=1024, description="torch threads; None: leave torch's default (more than 1024 crashed torch)"
    )
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="floating-point type of data and models; float64 for exactness checks"
    )
    executor: Literal["auto", "sequential", "vectorized"] = Field(
        "auto", description="how a round's clients train: auto = vectorized where the method and model support it"
    )
    client_chunk: int | None = Field(
        None, ge=1, description="vectorized: most clients stacked at once; None: all sampled clients"
    )
    compile: Literal["auto", "off", "on"] = Field(
        "auto",
        description="the executor's per-step function compiled with torch.compile (CUDA graphs on a GPU): "
        "auto = where it pays for its compile time (CPU: vectorized trials of enough lockstep steps; "
        "CUDA: long trials), on, off",
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _yaml_switch_words(cls, value: Any) -> Any:
        """YAML reads a bare on / off as true / false: take them as the words they were."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class Experiment(Strict):
    seed: int = Field(0, ge=0, le=2**32 - 1)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    fl: FLConfig = Field(default_factory=FLConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="free-form notes (e.g. where an exported config came from); never read by the run",
    )

    def clients_per_round(self) -> int:
        """How many clients a round samples: participation x the training clients (num_clients less
        data.holdout_clients) rounded half up, 1 to all."""
        n = self.data.training_clients()
        return min(n, max(1, math.floor(self.fl.participation * n + 0.5)))

    def data_seed(self) -> int:
        """The seed of the partition and split: `data.seed`, else `seed`."""
        return self.seed if self.data.seed is None else self.data.seed

    @model_validator(mode="after")
    def _cross_checks(self) -> Experiment:
        dataset = DATASETS.get(self.data.dataset)
        if dataset.uses_path and not self.data.path:
            raise ValueError(f"data.path: dataset {self.data.dataset} reads a file; set data.path to it")
        if self.data.path and not dataset.uses_path:
            users = ", ".join(n for n, d in DATASETS.as_dict().items() if d.uses_path)
            raise ValueError(f"data.path: not used by dataset {self.data.dataset}; datasets that read a file: {users}")
        if not self.eval.global_metrics and self.eval.target_metric.startswith("global_"):
            raise ValueError(
                f"eval.target_metric: {self.eval.target_metric} is not computed with eval.global_metrics false; "
                f"allowed: {', '.join(m for m in TARGET_METRICS if not m.startswith('global_'))}"
            )
        facts = dataset.facts(self.data)  # a file's facts come from the file: a bad file fails here
        self._check_model(facts.input_shape)
        self._check_partition(facts)
        return self

    def _check_model(self, input_shape: tuple[int, ...]) -> None:
        arch = self.model.arch
        spec = MODELS.get(arch)
        try:
            params = spec.Params(**self.model.params())
        except ValidationError as err:
            line = format_validation_error(err, spec.Params, prefix="model.", context=f" for arch {arch}")
            raise ValueError(
                line.replace("allowed keys: ", f"allowed keys: {', '.join(ModelConfig.model_fields)}, ")
                if "unknown key" in line
                else line
            ) from None
        split = {k: getattr(self.model, k) for k in ModelConfig.model_fields}
        self.model = ModelConfig(**split, **params.model_dump())
        limit = spec.linear_layers
        if self.model.head_layers > limit:
            raise ValueError(
                f"model.head_layers: {self.model.head_layers} is more than arch {arch} allows; allowed 1..{limit}"
            )
        side = min(input_shape[1:]) if len(input_shape) > 1 else 1
        if side < spec.min_side:
            fits = ", ".join(n for n, m in MODELS.as_dict().items() if m.min_side <= side)
            raise ValueError(
                f"model.arch: {arch} needs images of at least {spec.min_side}px; "
                f"for {self.data.dataset} allowed: {fits}"
            )

    def _check_partition(self, facts: Any) -> None:
        part, num_classes = self.data.partition, facts.num_classes
        if part.kind == "natural":
            if facts.natural_clients is None:
                raise ValueError(
                    f"data.partition.kind: natural needs a dataset with client ids (npz: a client "
                    f"array); {self.data.dataset} has none; allowed: iid, dirichlet, pathological"
                )
            if "num_clients" not in self.data.model_fields_set:
                self.data.num_clients = facts.natural_clients
            elif self.data.num_clients != facts.natural_clients:
                raise ValueError(
                    f"data.num_clients: the natural partition of {self.data.dataset} has "
                    f"{facts.natural_clients} clients (got {self.data.num_clients}); allowed: "
                    f"{facts.natural_clients}, or leave it out"
                )
            if self.data.pool == "train+test" and facts.natural_test is False:
                raise ValueError(
                    "data.pool: train+test with the natural partition needs the test samples' client "
                    "ids (npz: client_test); allowed here: train"
                )
        held = self.data.holdout_count()
        if held >= self.data.num_clients:
            raise ValueError(
                f"data.holdout_clients: {self.data.holdout_clients:g} holds out {held} of the "
                f"{self.data.num_clients} clients and leaves none to train; allowed: 0 to "
                f"{self.data.num_clients - 1}, or a fraction that leaves at least one"
            )
        if part.kind == "pathological":
            k = part.classes_per_client
            if k > num_classes:
                raise ValueError(
                    f"data.partition.classes_per_client: {k} exceeds the {num_classes} classes "
                    f"of {self.data.dataset}; allowed 1..{num_classes}"
                )
            if k * self.data.num_clients < num_classes:
                raise ValueError(
                    f"data.partition.classes_per_client: num_clients x classes_per_client must "
                    f"cover all {num_classes} classes (got {self.data.num_clients} x {k})"
                )

    @property
    def num_classes(self) -> int:
        return self.dataset_facts().num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(channels, height, width) of one sample of the dataset."""
        return self.dataset_facts().input_shape

    def dataset_facts(self) -> Any:
        """The dataset's `DatasetFacts` (classes, input shape, natural clients)."""
        return DATASETS.get(self.data.dataset).facts(self.data)


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested dict, making missing (or null) sections; a key through a value is
    a ConfigError. The one dotted-key setter: `--set` overrides and a trial's searched values."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` strings; values are parsed as YAML scalars (`0.1`, `true`, `[1, 2]`)."""
    tree = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected key=value, e.g. --set fl.lr=0.05")
        key, text = item.split("=", 1)
        try:
            value = load_text(text) if text else None
        except YamlTooLarge as err:
            raise ConfigError(f"--set {key.strip()}: value refused: {err}") from None
        except yaml.YAMLError:
            value = text
        set_dotted(tree, key.strip(), value)
    return tree


def file_problem(path: Path) -> str:
    """Why `path` (not a regular file) cannot be read as a YAML file."""
    if path.is_dir():
        return "is a folder; give a YAML file"
    if path.exists():
        return "is not a regular file (a pipe or device); give a YAML file"
    return "no such config file"


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {file_problem(path)}")
    try:
        data = load_text(read_text_bounded(path))
    except YamlTooLarge as err:
        raise ConfigError(f"{path}: refused: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected UTF-8 YAML)") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of config keys")
    return data


def experiment_to_dict(exp: Experiment) -> dict[str, Any]:
    return exp.model_dump(mode="json")

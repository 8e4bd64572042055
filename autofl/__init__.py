"""autofl: hyperparameter search for personalized federated learning.

The stable interface is what this module exports (`autofl.__all__`):

- running: `train`, `search`, `submit_slurm`, `load_study`, `list_studies`, `Study`, `RunResult`,
  `load_config` (autofl/api.py, the same code paths as the `autofl` command);
- writing a method: `Method`, `MethodParams` (autofl/methods/base.py) and the step language a
  method declares its local training in: `Stage`, `Update`, `ClientStart` (autofl/engine/plan.py);
- models: `SplitModel` (encoder -> projector -> head, autofl/models/parts.py) and a model's
  declaration, `ModelSpec`, `ModelParams`, `LinearSpec` (autofl/models/spec.py);
- datasets: a dataset's declaration, `DatasetSpec`, and what its loader returns, `RawDataset`
  (autofl/data/spec.py);
- errors: `AutoFLError` and its subclasses (autofl/errors.py).

`import autofl` stays cheap: each name is imported on first use (PEP 562), so torch, Ray and
Optuna load only when something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "train": "autofl.api",
    "search": "autofl.api",
    "submit_slurm": "autofl.api",
    "load_study": "autofl.api",
    "list_studies": "autofl.api",
    "load_config": "autofl.api",
    "Study": "autofl.api",
    "RunResult": "autofl.api",
    "Method": "autofl.methods.base",
    "MethodParams": "autofl.methods.base",
    "Stage": "autofl.engine.plan",
    "Update": "autofl.engine.plan",
    "ClientStart": "autofl.engine.plan",
    "SplitModel": "autofl.models.parts",
    "ModelSpec": "autofl.models.spec",
    "ModelParams": "autofl.models.spec",
    "LinearSpec": "autofl.models.spec",
    "DatasetSpec": "autofl.data.spec",
    "RawDataset": "autofl.data.spec",
    "AutoFLError": "autofl.errors",
    "ArgumentError": "autofl.errors",
    "ConfigError": "autofl.errors",
    "DataError": "autofl.errors",
    "StorageError": "autofl.errors",
    "RunDiverged": "autofl.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from autofl.api import RunResult, Study, list_studies, load_config, load_study, search, submit_slurm, train
    from autofl.data.spec import DatasetSpec, RawDataset
    from autofl.engine.plan import ClientStart, Stage, Update
    from autofl.errors import ArgumentError, AutoFLError, ConfigError, DataError, RunDiverged, StorageError
    from autofl.methods.base import Method, MethodParams
    from autofl.models.parts import SplitModel
    from autofl.models.spec import LinearSpec, ModelParams, ModelSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autofl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

"""The references `harmed_frac` and `harmed_vs_global` compare each client with (issue 40 item 2,
autofl.engine.harm): the same partition and seed trained by the `local` method (every client alone,
no communication) and by FedAvg (its global model), with the study's base training settings. Computed
once per reference config and cached as JSON in a folder (a study's `references/`), under a file lock
so that concurrent trials compute it once; a run never counts them against a trial's rounds or budget."""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from autofl.config import Experiment, FLConfig
from autofl.data.datasets import RawDataset
from autofl.engine.harm import HarmReference
from autofl.engine.metrics import client_test_accuracies
from autofl.engine.simulation import Simulation
from autofl.experiment import build_experiment
from autofl.files import write_atomic
from autofl.methods.registry import get_method_class


def reference_experiment(exp: Experiment, method: str, fl: FLConfig | None = None) -> Experiment:
    """`exp`'s data, seed and model architecture (its arch's own parameters, no method's projector),
    trained by `method` with `fl` (default: exp's), evaluated at its last round only (what the
    references read), without newcomer training or a target."""
    d = exp.model_dump(mode="json")
    model = {"arch": exp.model.arch, "head_layers": exp.model.head_layers, **(exp.model.model_extra or {})}
    training = (fl or exp.fl).model_dump(mode="json")
    return build_experiment(
        {
            "seed": d["seed"],
            "data": d["data"],
            "model": model,
            "fl": {**training, "eval_every": training["rounds"]},
            "method": {"name": method},
            "eval": {"newcomer_epochs": 0},
            "runtime": d["runtime"],
        }
    )


def reference_key(local: Experiment) -> str:
    """What fixes both references' numbers (the two runs differ in their method only): data, seed,
    model, fl, dtype (not threads or executor)."""
    parts = {k: local.model_dump(mode="json")[k] for k in ("seed", "data", "model", "fl")}
    return hashlib.sha256(json.dumps([parts, local.runtime.dtype], sort_keys=True).encode()).hexdigest()[:24]


def compute_reference(
    local: Experiment, fedavg: Experiment, raw: RawDataset | None = None, device: torch.device | None = None
) -> HarmReference:
    accuracies = []
    for exp, global_model in ((local, False), (fedavg, True)):
        sim = Simulation(exp, get_method_class(exp.method.name), raw=raw, device=device)
        for _ in sim.run():
            pass
        accuracies.append(client_test_accuracies(sim, global_model=global_model))
    return HarmReference(*accuracies)


def harm_reference(
    exp: Experiment,
    fl: FLConfig | None = None,
    folder: Path | None = None,
    raw: RawDataset | None = None,
    device: torch.device | None = None,
) -> HarmReference:
    """The references for `exp`'s partition and seed with training settings `fl` (default exp's),
    read from `folder` when cached there, else computed (and cached when `folder` is given)."""
    local, fedavg = reference_experiment(exp, "local", fl), reference_experiment(exp, "fedavg", fl)
    if folder is None:
        return compute_reference(local, fedavg, raw, device)
    folder.mkdir(parents=True, exist_ok=True)
    key = reference_key(local)
    path = folder / f"{key}.json"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one computes, the others wait and read its file
        cached = _read(path)
        if cached is not None:
            return cached
        reference = compute_reference(local, fedavg, raw, device)
        record = {"reference": reference.to_json(), "local": local.model_dump(mode="json")}
        write_atomic(path, json.dumps(record, indent=1))
        return reference


def _read(path: Path) -> HarmReference | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return HarmReference.from_json(data["reference"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: computed again

"""The Ray Tune trainable: one FL run, one result per evaluated round, full-state checkpoints.

It knows nothing of ASHA or Optuna: it builds the experiment from the trial's config, reports
round metrics (with `round` as the time attribute) and saves / restores the simulation state.

A checkpoint holds what an exact restore needs (round, global and client states, the method's
server state, the metric history, the RNG state) as tensors and plain containers, and is loaded
with `torch.load(weights_only=True)`. It is written when at least `checkpoint_every_s` seconds of
training passed since the last one (Tune's `should_checkpoint`), and at the end: a trial whose
rounds take milliseconds is cheaper to re-run after a crash than to checkpoint every round.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from autofl.config import FLConfig
from autofl.data.datasets import RawDataset
from autofl.device import resolve_device
from autofl.engine.simulation import Simulation
from autofl.experiment import build_experiment
from autofl.features import ClassStats
from autofl.harm_references import harm_reference
from autofl.methods.registry import get_method_class
from autofl.registry import load_plugins
from autofl.tuning.strategy.space import experiment_dict
from autofl.tuning.tune.gpu_packing import needed_bytes, oom_line

STATE_FILE = "simulation.pt"


def trial_device() -> torch.device:
    """`cuda` when Ray gave this trial a GPU, else the CPU (outside Ray, e.g. in tests: the CPU,
    without starting a Ray instance just to ask)."""
    has_gpu = ray.is_initialized() and bool(ray.get_gpu_ids())
    return resolve_device("auto" if has_gpu else "cpu")


class TrialOutOfGPUMemory(RuntimeError):
    """A trial ran out of GPU memory: one line naming what it needed and its share of the card."""

    def __init__(self, device: torch.device, err: BaseException):
        card = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
        context = ray.get_runtime_context() if ray.is_initialized() else None
        # a trial's share of its card; outside a Ray worker (a driver, a plain process) the whole card
        share = (
            context.get_assigned_resources().get("GPU", 1.0)
            if context and context.worker.mode == ray.WORKER_MODE
            else 1.0
        )
        super().__init__(oom_line(needed_bytes(err), card, share))


class FLTrainable(tune.Trainable):
    def setup(
        self,
        config: dict[str, Any],
        base: dict[str, Any] | None = None,
        raw_data: RawDataset | None = None,
        threads: int = 1,
        checkpoint_every_s: float = 0.0,
        method_base: dict[str, dict[str, Any]] | None = None,
        reference_dir: str | None = None,
        seal_test: bool = False,
    ) -> None:
        torch.set_num_threads(max(1, threads))
        self._reference_dir = reference_dir  # where eval.harmed_clients' references are cached (the study's)
        # a search's trial: its data holds no test split, so the test metrics (and the harmed-client
        # fractions, read off the test splits) are absent from its rounds; re-evaluation reads them
        self._seal_test = seal_test
        load_plugins()  # this worker's process sees the methods, models, datasets of installed plugins
        self._base, self._raw, self._method_base = base or {}, raw_data, method_base or {}
        self._checkpoint_every_s = checkpoint_every_s
        self._unsaved_s = 0.0  # training time since the last checkpoint
        self.sim = self._simulation(config)
        self.last: dict[str, Any] | None = None
        self._node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"

    def _simulation(self, config: dict[str, Any]) -> Simulation:
        exp = build_experiment(experiment_dict(self._base, config, self._method_base))
        # the shared dataset, unless the dataset itself is searched: then this trial loads its own
        raw = self._raw if self._raw is not None and self._raw.name == exp.data.dataset else None
        sim = Simulation(
            exp, get_method_class(exp.method.name), raw=raw, device=trial_device(), sealed_test=self._seal_test
        )
        # the study's references for this partition and seed, with the base's training (re-evaluation only)
        if exp.eval.harmed_clients and not self._seal_test:
            folder = Path(self._reference_dir) if self._reference_dir else None
            sim.harm_reference = harm_reference(exp, FLConfig(**self._base.get("fl", {})), folder, raw, sim.device)
        return sim

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Reuse this worker for the next trial (no new process, no second torch import)."""
        self.sim = self._simulation(new_config)
        self.last = None
        self._unsaved_s = 0.0
        return True

    def step(self) -> dict[str, Any]:
        if self.sim.done() and self.last is not None:  # restored from the final checkpoint
            return {**self.last, "node_id": self._node_id, "done": True, "should_checkpoint": False}
        start = time.perf_counter()
        metrics = None
        while metrics is None:
            try:
                metrics = self.sim.run_round()
            except torch.OutOfMemoryError as err:  # this trial fails alone, in one line; the study goes on
                raise TrialOutOfGPUMemory(self.sim.device, err) from None
        if not math.isfinite(metrics["train_loss"]):  # the searcher records FAIL with this reason, no traceback
            reason = f"diverged at round {metrics['round']}: train_loss is {metrics['train_loss']}"
            return {**metrics, "node_id": self._node_id, "diverged": reason, "done": True, "should_checkpoint": False}
        self.last = metrics
        self._unsaved_s += time.perf_counter() - start
        due = self._unsaved_s >= self._checkpoint_every_s and not self.sim.done()  # the end is saved anyway
        return {**metrics, "node_id": self._node_id, "done": self.sim.done(), "should_checkpoint": due}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save(self.sim.state_dict(), os.path.join(checkpoint_dir, STATE_FILE))
        self._unsaved_s = 0.0

    # Ray passes the checkpoint's folder (a str) where save_checkpoint returns None; its annotation says dict
    def load_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        with torch.serialization.safe_globals([ClassStats]):
            state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=True)
        self.sim.load_state_dict(state)
        self.last = self.sim.history[-1] if self.sim.history else None


class RunListTrainable(FLTrainable):
    """An FLTrainable over a fixed list of trial configs (re-evaluation): config {"run": i} trains
    `runs[i]`, so Tune's grid over indices runs each listed config once."""

    def setup(
        self, config: dict[str, Any], *args: Any, runs: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> None:
        self._runs = runs or []
        super().setup(self._runs[config["run"]], *args, **kwargs)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        return super().reset_config(self._runs[new_config["run"]])

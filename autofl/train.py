"""`autofl train`: one FL run, with its metrics, resolved config and final state written to a folder."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Callable

import torch
import yaml

from autofl.config import Experiment, experiment_to_dict
from autofl.engine.simulation import Simulation
from autofl.errors import AutoFLError, RunDiverged

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
STATE_FILE = "final_state.pt"


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Everything about `--out` that can fail, checked before any work: not a file, not under a
    file, writable, and not an earlier run's folder unless --overwrite."""
    if out.exists() and not out.is_dir():
        raise AutoFLError(f"--out {out}: is a file; give a folder")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise AutoFLError(f"--out {out}: {existing} is a file, so no folder can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AutoFLError(f"--out {out}: {existing} is not writable")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise AutoFLError(f"--out {out}: folder already holds files; choose another folder or pass --overwrite")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_training(
    exp: Experiment, out: Path, on_round: Callable[[dict[str, float], float], None] | None = None,
    overwrite: bool = False, announce: Callable[[str], None] | None = None,
    on_clients: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """Run `exp` to the end, appending each evaluated round to `out/metrics.jsonl`; `announce`
    receives the line saying which executor trains the clients, `on_clients` how many more of a
    round's clients finished training (a progress bar within long rounds)."""
    check_out_dir(out, overwrite)
    sim = Simulation(exp)  # loads the data first: a missing dataset fails before anything is written
    sim.clients_done = on_clients
    if announce is not None:
        announce(sim.executor_line)
    out.mkdir(parents=True, exist_ok=True)  # check_out_dir above already refused what must not be written
    write_atomic(out / CONFIG_FILE, yaml.safe_dump(experiment_to_dict(exp), sort_keys=False))
    history: list[dict[str, float]] = []
    with open(out / METRICS_FILE, "w") as fh:
        start = time.perf_counter()
        for metrics in sim.run():
            fh.write(json.dumps(metrics) + "\n")
            fh.flush()
            history.append(metrics)
            if not math.isfinite(metrics["train_loss"]):
                raise RunDiverged(f"training diverged at round {metrics['round']}: train_loss is "
                                  f"{metrics['train_loss']} (try a lower fl.lr); rounds so far are in {out / METRICS_FILE}")
            if on_round is not None:
                on_round(metrics, time.perf_counter() - start)
    tmp = out / (STATE_FILE + ".tmp")
    torch.save(sim.state_dict(), tmp)
    os.replace(tmp, out / STATE_FILE)
    return history

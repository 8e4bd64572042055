"""One FL run, its metrics, resolved config and final state written to a folder (`autofl.train`, `autofl train`)."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from autofl.config import Experiment, experiment_to_dict
from autofl.device import run_threads
from autofl.engine.simulation import Simulation
from autofl.engine.state import plain_tree
from autofl.errors import AutoFLError, OutputError, RunDiverged
from autofl.files import not_a_regular_file, write_atomic, write_failed
from autofl.harm_references import harm_reference
from autofl.methods.registry import get_method_class

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
STATE_FILE = "final_state.pt"
RUN_FILES = (METRICS_FILE, CONFIG_FILE, STATE_FILE)  # what a run's folder holds


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Everything about `--out` that can fail, checked before any work: not a file, not under a
    file, writable, and not an earlier run's folder unless --overwrite."""
    if out.is_symlink():
        raise AutoFLError(
            f"--out {out}: is a symbolic link; autofl writes a run only into a real folder, never "
            f"through a link; give the folder itself"
        )
    if out.exists() and not out.is_dir():
        raise AutoFLError(f"--out {out}: is {not_a_regular_file(out) or 'a file'}; give a folder")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise AutoFLError(f"--out {out}: {existing} is a file, so no folder can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AutoFLError(f"--out {out}: {existing} is not writable")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise AutoFLError(f"--out {out}: folder already holds files; choose another folder or pass --overwrite")
    if out.is_dir() and any(out.iterdir()) and Path.cwd().resolve().is_relative_to(out.resolve()):
        raise AutoFLError(
            f"--out {out}: --overwrite replaces the folder as a whole, and this one holds the current "
            f"folder; give a subfolder, e.g. --out runs/new"
        )
    if out.is_dir():  # --overwrite replaces the folder as a whole: only an earlier run's folder
        others = sorted(p.name for p in out.iterdir() if p.name not in RUN_FILES)
        if others:
            raise AutoFLError(
                f"--out {out}: --overwrite replaces an earlier run's folder, but this one also holds "
                f"{', '.join(others[:3])}{' ...' if len(others) > 3 else ''}; choose another folder"
            )


def check_device(name: str) -> None:
    """`runtime.device: cuda[:N]` names a GPU torch sees (else a CUDA error deep in the first round)."""
    if not name.startswith("cuda"):
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(name.split(":", 1)[1]) if ":" in name else 0
    if index >= count:
        seen = f"torch sees {count} GPU{'s' if count != 1 else ''}" + (f" (cuda:0..cuda:{count - 1})" if count else "")
        raise AutoFLError(
            f"runtime.device: {name!r} but {seen}; allowed: auto or cpu"
            + (f", cuda:0..cuda:{count - 1}" if count else "")
        )


def run_training(
    exp: Experiment,
    out: Path,
    on_round: Callable[[dict[str, float], float], None] | None = None,
    overwrite: bool = False,
    announce: Callable[[str], None] | None = None,
    on_clients: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """Run `exp` to the end, appending each evaluated round to `out/metrics.jsonl`; `announce`
    receives the line saying which executor trains the clients, `on_clients` how many more of a
    round's clients finished training (a progress bar within long rounds).

    Overwriting a folder that holds an earlier run writes the new run into a hidden sibling folder
    and swaps it in at the end: an interrupted run leaves the earlier one whole, never a mix."""
    check_out_dir(out, overwrite)
    check_device(exp.runtime.device)

    torch.set_num_threads(run_threads(exp.runtime.threads))  # the CPUs it is given, not every core
    # loads the data first: a missing dataset fails before anything is written
    sim = Simulation(exp, get_method_class(exp.method.name))
    sim.clients_done = on_clients
    if announce is not None:
        announce(sim.executor_line)
    if exp.eval.harmed_clients:  # its references, two runs on the same partition and seed (not cached)
        if announce is not None:
            announce("eval.harmed_clients: training the references first (local and FedAvg, same partition and seed)")
        sim.harm_reference = harm_reference(exp, device=sim.device)
    replacing = out.is_dir() and any(out.iterdir())
    work = out.with_name(f".{out.name}.new-{os.getpid()}") if replacing else out
    if replacing and announce is not None:
        announce(f"--overwrite: the run is written to {work} and replaces {out} when it ends")
    if replacing:
        _remove_stale_work(out)
    made = not work.exists()
    try:
        work.mkdir(parents=True, exist_ok=True)  # check_out_dir above already refused what must not be written
    except OSError as err:
        raise write_failed(work, err) from None
    try:
        history = _train_into(sim, exp, work, on_round)
    except BaseException as err:  # an interrupted or failed --overwrite leaves no hidden half-run folder
        if (replacing and not isinstance(err, RunDiverged)) or (
            made and isinstance(err, OutputError)
        ):  # (a diverged run's message points at its rounds)
            shutil.rmtree(work, ignore_errors=True)
        raise
    if replacing:
        _swap_in(work, out)
    return history


def _remove_stale_work(out: Path) -> None:
    """Hidden `.NAME.new-PID` folders that a killed `--overwrite` run left (its process is gone)."""
    for stale in out.parent.glob(f".{out.name}.new-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or stale.is_symlink():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # alive, another user's
            pass


def _train_into(
    sim: Simulation, exp: Experiment, work: Path, on_round: Callable[[dict[str, float], float], None] | None
) -> list[dict[str, float]]:
    write_atomic(work / CONFIG_FILE, yaml.safe_dump(experiment_to_dict(exp), sort_keys=False))
    history: list[dict[str, float]] = []
    metrics_path = work / METRICS_FILE
    try:
        fh = open(metrics_path, "x")  # noqa: SIM115  (its own error line; the `with fh` below closes it)
    except OSError as err:
        raise write_failed(metrics_path, err) from None
    with fh:
        start = time.perf_counter()
        for metrics in sim.run():
            try:
                fh.write(json.dumps(metrics) + "\n")
                fh.flush()
            except OSError as err:
                raise write_failed(metrics_path, err) from None
            history.append(metrics)
            if not math.isfinite(metrics["train_loss"]):
                raise RunDiverged(
                    f"training diverged at round {metrics['round']}: train_loss is "
                    f"{metrics['train_loss']} (try a lower fl.lr); rounds so far are in {work / METRICS_FILE}"
                )
            if on_round is not None:
                on_round(metrics, time.perf_counter() - start)
    buffer = io.BytesIO()  # saved in memory, then written by the one writer (a full disk: one line)
    torch.save(plain_tree(sim.state_dict()), buffer)  # loadable with weights_only=True, without autofl
    write_atomic(work / STATE_FILE, buffer.getvalue())
    return history


def _swap_in(new: Path, out: Path) -> None:
    """Replace folder `out` by `new` (two renames; the earlier run is deleted only after)."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)

"""Starting Ray for a study command: the environment Tune reads, a local Ray of our own or a
cluster's, and Ray's output routed into the study's logs/ folder (autofl/tuning/tune/logs.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autofl.tuning.strategy.space import SearchSpace
from autofl.tuning.tune.logs import route_driver_logs, worker_log_hook
from autofl.tuning.tune.preflight import memory_slots

# Tune writes its experiment state (trials, searcher) at most this often; a killed driver loses
# at most this much bookkeeping, and Optuna's storage is written at every trial event anyway.
SNAPSHOT_S_DEFAULT = "2"


def tune_environment() -> None:
    """The environment Ray and Tune read (set before Ray is imported where possible; a value the
    user set stays)."""
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", SNAPSHOT_S_DEFAULT)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's classic output engine: silent at verbose=0
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def snapshot_seconds() -> float:
    return float(os.environ.get("TUNE_GLOBAL_CHECKPOINT_S", SNAPSHOT_S_DEFAULT))


def init_ray(address: str | None, worker_log: Path | None = None, verbose: bool = True) -> None:
    """Connect to the cluster at `address`, or start a Ray of our own (never whatever cluster
    /tmp/ray names) on this machine's CPUs. With `worker_log`, what trial processes log is
    appended there (a worker process setup hook), and it reaches this terminal only if `verbose`."""
    tune_environment()
    import ray

    if ray.is_initialized():
        return
    # Ray's log records go where autofl.tuning.tune.logs routes them (the study's logs/ folder); without
    # routing (e.g. in tests) Ray's own stderr handler, installed when ray is imported, stays
    common: dict[str, Any] = dict(
        include_dashboard=False, configure_logging=False, log_to_driver=verbose or worker_log is None
    )
    if worker_log is not None:
        common["runtime_env"] = {"worker_process_setup_hook": worker_log_hook(str(worker_log))}
    if address is not None:
        ray.init(address=address, **common)
        return
    # stating the CPUs saves Ray's resource probe (measured: init 2.3 s instead of 3.3 s on 2 cores)
    ray.init(address="local", num_cpus=len(os.sched_getaffinity(0)), **common)


def start_ray(
    study_root: Path, address: str | None, verbose: bool, meanwhile: Callable[[], None] | None = None
) -> Path:
    """Start (or connect to) Ray with its output routed into `<study>/logs/` (returned); `meanwhile`
    runs in a thread while Ray's processes start, and what it raises is raised here once Ray started."""
    tune_environment()

    folder = route_driver_logs(study_root, verbose)
    raised: list[BaseException] = []

    def side_work(work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001  # raised in the caller's thread, below
            raised.append(exc)

    side = threading.Thread(target=side_work, args=(meanwhile,), daemon=True) if meanwhile is not None else None
    if side is not None:
        side.start()
    init_ray(address, worker_log=folder / "workers.log", verbose=verbose)
    if side is not None:
        side.join()
    if raised:
        raise raised[0]
    return folder


def concurrent_slots(resources: dict[str, float], space: SearchSpace) -> int:
    """How many of the study's trials the cluster's `resources` hold at once (at least one)."""
    slots = resources.get("CPU", 0.0) // space.resources.cpu
    if space.resources.gpu_share > 0:
        slots = min(slots, resources.get("GPU", 0.0) // space.resources.gpu_share)

    slots = min(slots, memory_slots(resources) or slots)  # issue 18: a tiny cpu share is bounded by memory too
    return max(1, int(slots))


def max_concurrent(space: SearchSpace) -> int:
    """Trials in flight at once: the space's `resources.max_concurrent`, else one per slot of the
    cluster. Tune then keeps that many trials pending (with a searcher it keeps one by default),
    so every slot's worker starts at once; with one pending trial, a trial shorter than a worker's
    start (import torch, build the simulation: seconds) went to the first reused worker while the
    other nodes' workers were still starting, and a cluster trained one trial at a time."""
    import ray

    return space.resources.max_concurrent or concurrent_slots(ray.cluster_resources(), space)

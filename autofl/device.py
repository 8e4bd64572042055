"""Where tensors live and on how many threads: the one rule that turns a device setting into a
`torch.device`, and the CPUs a run is given."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch


def resolve_device(name: str) -> torch.device:
    """`runtime.device` (auto, cpu, cuda, cuda:N) as a torch.device; "auto" is cuda when torch
    sees a GPU, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def available_cpus() -> int:
    """The CPUs this process is given: its affinity mask (taskset, a Slurm or container cpuset),
    cut to its cgroup's CPU quota (cpu.max) where one is set; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def run_threads(configured: int | None) -> int:
    """Torch threads of an `autofl train` run: `runtime.threads`, else the CPUs the process is
    given (torch's own default counts every core of the machine, so on a shared machine a run
    oversubscribed it: a round took 27 s against 1.9 s at one thread). Trials take theirs from the
    space's `resources.cpu` (autofl/tuning/tune/trainable.py)."""
    return configured if configured else available_cpus()

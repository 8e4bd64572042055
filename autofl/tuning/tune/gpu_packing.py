"""`resources.gpu: auto`: as many trials per GPU as one trial's measured peak memory allows.

One trial's peak GPU memory is measured on a dry round (the base experiment, one round, on the
card: `torch.cuda.max_memory_allocated`, which counts the data, the models, the stacked clients and
the activations); a card then holds floor(total x (1 - margin) / peak) trials, and each trial asks
Tune for 1/N of a GPU (Tune's fractional GPUs), N no more than the trials that run at once (this
machine's CPUs over the trial's `resources.cpu`, and `max_concurrent` where set). The margin leaves
room for the CUDA context, allocator fragmentation and trials whose searched values (a larger batch,
more clients per chunk) need more than the base did; a trial that still runs out fails alone with `oom_line`.

A driver resolves `auto` once, as an explicit step before it runs trials
(`SearchSpace.resolve_resources`); parsing a space measures nothing, and the trials' processes are
given the resolved share. On a machine without CUDA `auto` is 0.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import torch

from autofl.engine.simulation import Simulation
from autofl.methods.registry import get_method_class

MARGIN = 0.2  # of the card kept free
GIB = 1024**3


def trials_per_card(peak_bytes: int, card_bytes: int, margin: float = MARGIN) -> int:
    """How many trials of `peak_bytes` fit a card of `card_bytes` with `margin` kept free (at least 1:
    a trial that does not fit alone still gets the whole card, and fails with `oom_line` if it must)."""
    if peak_bytes <= 0:
        raise ValueError("peak_bytes must be positive")
    return max(1, math.floor(card_bytes * (1 - margin) / peak_bytes))


def gpu_fraction(trials: int) -> float:
    """The GPU share each of `trials` trials asks Tune for; `trials` of them never exceed 1."""
    return math.floor(1e4 / trials) / 1e4


def concurrent_trials(cpus: int | None, cpus_per_trial: float, max_concurrent: int | None = None) -> int | None:
    """How many trials of `cpus_per_trial` CPUs run at once on a machine of `cpus` CPUs, and at most
    `max_concurrent` (the space's limit, if set); None: not known."""
    if not cpus:
        return max_concurrent
    most = max(1, math.floor(cpus / cpus_per_trial))
    return min(most, max_concurrent) if max_concurrent else most


def sharing_trials(
    peak_bytes: int, card_bytes: int, margin: float = MARGIN, max_trials: int | None = None
) -> tuple[int, int]:
    """(trials that share a card, trials its memory fits): no more than `max_trials` (the trials that run
    at once) share it, since a finer share would only say that more trials share the card than ever run."""
    fit = trials_per_card(peak_bytes, card_bytes, margin)
    return (min(fit, max_trials) if max_trials else fit), fit


def packing_line(peak_bytes: int, card_bytes: int, margin: float = MARGIN, max_trials: int | None = None) -> str:
    """The `resources.gpu: auto` line: the share, the peak, and how many trials share a card (and how many
    its memory fits, where fewer run at once)."""
    n, fit = sharing_trials(peak_bytes, card_bytes, margin, max_trials)
    capped = f"; memory fits {fit}, {n} run at once" if n < fit else ""
    return (
        f"resources.gpu: auto = {gpu_fraction(n):g}: a trial peaks at {peak_bytes / GIB:.2f} GiB of GPU memory "
        f"in a dry round, so {n} trial{'s' if n > 1 else ''} share each {card_bytes / GIB:.1f} GiB card "
        f"({margin:.0%} kept free{capped})"
    )


def packed_share(peak_bytes: int, card_bytes: int, margin: float = MARGIN, max_trials: int | None = None) -> float:
    """The GPU share each trial asks for (`sharing_trials`)."""
    return gpu_fraction(sharing_trials(peak_bytes, card_bytes, margin, max_trials)[0])


def machine_cpus() -> int | None:
    """The CPUs this process may run on (its affinity: a container's or a scheduler's limit), else the count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


def oom_line(needed_bytes: int | None, card_bytes: int, share: float, measured_peak: int | None = None) -> str:
    """The one line a trial that ran out of GPU memory fails with."""
    needed = f"{needed_bytes / GIB:.2f} GiB more" if needed_bytes else "more memory"
    peak = f" (the dry round peaked at {measured_peak / GIB:.2f} GiB)" if measured_peak else ""
    return (
        f"out of GPU memory: the trial needed {needed} than its share left, {share:g} of a "
        f"{card_bytes / GIB:.1f} GiB card{peak}; set resources.gpu to a larger share (e.g. "
        f"{min(1.0, share * 2):g}) or lower fl.batch_size / runtime.client_chunk"
    )


def needed_bytes(err: BaseException) -> int | None:
    """The allocation torch's out-of-memory message names ("Tried to allocate 2.00 GiB"), in bytes."""
    found = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", str(err))
    if not found:
        return None
    unit = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": GIB, "TiB": 1024**4}[found.group(2)]
    return int(float(found.group(1)) * unit)


def measure_peak_bytes(exp: Any) -> int:
    """Peak GPU memory of one dry round of `exp` on the current CUDA device."""
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    dry = exp.model_copy(update={"fl": exp.fl.model_copy(update={"rounds": 1, "eval_every": 1})})
    sim = Simulation(dry, get_method_class(dry.method.name), device=device, sealed_test=True)  # as a trial holds it
    sim.run_round()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - start
    del sim
    torch.cuda.empty_cache()
    return max(peak, 1)


def resolve_auto_gpu(
    exp: Any, cpus_per_trial: float = 1.0, max_concurrent: int | None = None, width: int = 1
) -> tuple[float, str]:
    """(GPU share per trial, the line saying why) for `resources.gpu: auto` with base experiment `exp`, for
    trials of `cpus_per_trial` CPUs, at most `max_concurrent` at once (no more trials share the card than
    run at once on this machine), each training `width` configs (`resources.population`: sized as `width`
    times one config's peak, an upper bound, since a population's members share the data)."""
    if not torch.cuda.is_available():
        share, line = 0.0, "resources.gpu: auto = 0: no CUDA GPU on this machine, trials train on the CPU"
    else:
        peak, card = measure_peak_bytes(exp) * max(1, width), torch.cuda.get_device_properties(0).total_memory
        most = concurrent_trials(machine_cpus(), cpus_per_trial, max_concurrent)
        share, line = packed_share(peak, card, max_trials=most), packing_line(peak, card, max_trials=most)
    return share, line

"""`resources.population: auto`: how many configs one trial trains together, measured.

A dry round of the base experiment is timed as a population of C copies (its steps compiled or eager as
the trials' will be, `autofl.population.population_compile`: the first round, which compiles, is not
timed), for C = 1, 2, 4, ... up to
`MAX_WIDTH` (and no more than each of the trials that run at once would get: ceil(trials / slots)),
on the device the trials use and with their threads. Each doubling must gain `MIN_GAIN` in config-rounds
per second over the width before it: growing stops at the first that does not (the width before it is
chosen: a dry round times one population alone, and a wider cohort pays what it does not see, its
compiles as it shrinks and its members' tails), at one that runs out of GPU memory (never chosen), or once
the probe spent `PROBE_BUDGET_S` (the last width measured is chosen where it gained enough). A method
that cannot train configs together (`population_ready` unset) or a model the vectorized executor cannot
batch gets 1 without a measurement.

The driver resolves `auto` once, before it runs trials (`SearchSpace.resolve_resources`, as for
`resources.gpu: auto`); `autofl search` prints the line saying what it chose and why.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from autofl.accel.choice import vectorizable
from autofl.data.datasets import load_raw_dataset
from autofl.engine.simulation import Simulation
from autofl.methods.registry import get_method_class
from autofl.population import Population, population_compile

MAX_WIDTH = 64
MIN_GAIN = 1.15  # a wider population must run this many times the config-rounds per second
PROBE_BUDGET_S = 60.0


def config_rounds_per_s(exp: Any, width: int, raw: Any, device: torch.device) -> float:
    """Config-rounds per second of one round (after the first, which pays the one-time costs; where the
    population's steps are compiled and its method's steps may change with the round, after the second
    too: a loss that changes once its server state exists, FedProto's say, compiles anew) of a population
    of `width` copies of `exp`. (Width 1 is the config run alone, whose own executor may compile: its first
    round is not timed either.)"""
    population = Population([exp] * width, raw=raw, device=device, sealed_test=True)
    population.run_round()
    if population.executor is not None and population.compile_steps and not population.same_steps:
        population.run_round()
    start = time.perf_counter()
    population.run_round()
    return width / max(time.perf_counter() - start, 1e-9)


def resolve_auto_population(
    exp: Any, trials: int, slots: int, threads: int, device: torch.device | None = None
) -> tuple[int, str]:
    """(width, the line saying why) for `resources.population: auto` with base experiment `exp`, a run of
    `trials` trials of which `slots` train at once, each with `threads` CPU threads."""
    method_cls = get_method_class(exp.method.name)
    if not getattr(method_cls, "population_ready", False):
        return 1, f"resources.population: auto = 1: method {exp.method.name} trains configs one by one"
    device = device or torch.device("cpu")
    sim = Simulation(exp, method_cls, device=device)
    if vectorizable(sim.workspace) is not None:
        return 1, "resources.population: auto = 1: the model cannot be batched (see autofl train's executor line)"
    cap = max(1, min(MAX_WIDTH, math.ceil(trials / max(1, slots))))
    if cap == 1:
        return 1, f"resources.population: auto = 1: {trials} trial(s) over {slots} slot(s)"
    raw = load_raw_dataset(exp.data)
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    began, rates, chosen = time.perf_counter(), {}, 1
    try:
        width = 1
        while width <= cap:
            try:
                rates[width] = config_rounds_per_s(exp, width, raw, device)
            except torch.OutOfMemoryError:
                break
            if width > 1 and rates[width] < MIN_GAIN * rates[chosen]:
                break  # the last doubling gained too little: the width before it stays chosen
            chosen = width
            if time.perf_counter() - began > PROBE_BUDGET_S or width == cap:
                break
            width = min(width * 2, cap)
    finally:
        torch.set_num_threads(before)
    measured = ", ".join(f"{w}: {r:.2f}" for w, r in sorted(rates.items()))
    steps = f"; {population_compile(sim, chosen)[1]}" if chosen > 1 else ""
    return chosen, (
        f"resources.population: auto = {chosen}: config-rounds/s of a dry round by width {{{measured}}} "
        f"on {device.type}, {threads} thread(s); at most {cap} ({trials} trials over {slots} slot(s)){steps}"
    )

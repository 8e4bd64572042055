"""Clients held out of training (`data.holdout_clients`), tested as newcomers (pFL-Bench's
participation gap): at each evaluated round every held-out client receives what a sampled client
receives, trains `eval.newcomer_epochs` local epochs with the method's own local step on its own
training split, as a client does in its first round, and is tested with the method's personal model.
Nothing of a newcomer reaches the server, the other clients or the run's cost: it is evaluation."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from autofl.engine.executor import ClientJob, RoundPlan
from autofl.engine.state import StateDict
from autofl.seeding import SeedPurpose, derived_seed


@dataclasses.dataclass
class Newcomer:
    """A held-out client after its newcomer training: the weights it left (`trained`) and what the
    method kept of them (`state`, its client state: what its `sharing` keeps and its `remember` stores)."""

    trained: StateDict
    state: dict[str, Any]


def personalize_newcomers(sim: Any) -> list[Newcomer]:
    """Each held-out client after its newcomer training (`sim`: a Simulation after an evaluated
    round); with `eval.newcomer_epochs: 0`, the start it received, untrained."""
    data, method = sim.data, sim.method
    if not data.newcomers:
        return []
    starts = [method.client_start(sim.global_state, {}, sim.server_state) for _ in data.newcomers]
    epochs = sim.exp.eval.newcomer_epochs
    if epochs:
        # the plan of the round a newcomer would join (the next one), for its own number of epochs
        plan: RoundPlan = dataclasses.replace(sim.round_plan(), local_epochs=epochs, clients_done=None)
        jobs = [
            ClientJob(
                len(data.clients) + k,  # after the training clients' ids: a newcomer is no training client
                start,
                split.train,
                torch.Generator().manual_seed(derived_seed(sim.exp.seed, sim.round, k, SeedPurpose.NEWCOMER_BATCHES)),
            )
            for k, (split, start) in enumerate(zip(data.newcomers, starts))
        ]
        trained = [outcome.state for outcome in sim.executor.train(plan, jobs, data.x, data.y)]
    else:
        trained = [start.models["model"] for start in starts]
    newcomers = []
    for weights in trained:
        state: dict[str, Any] = {}
        method.keep_private(weights, state)
        newcomers.append(Newcomer(weights, state))
    return newcomers

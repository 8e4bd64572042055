"""The Ray Tune trainables of population trials: a cohort of configs trained as one batched model
(a study's, `CohortTrainable`; re-evaluation's runs, `RunListCohortTrainable`).

Its config lists the members (`{"members": [{"id", "number", "params"}, ...]}`, the searcher's
cohort, autofl/tuning/strategy/cohorts.py); it trains them as one `autofl.population.Population`
(each member's rounds are those of its run alone) and reports, for every evaluated round, one result
whose `members` holds each member's metrics with its id and Optuna number (the searcher records each
as its trial's value, ASHA judges each on its own). Top level, the result carries the round and the
best member's objective value (what Tune checks a result for).

Before each round it drops the members the study has finished (ASHA pruned them at the last result:
Tune starts the next round only after the driver handled the last one), so a pruned member costs no
further compute; a member whose loss diverged is reported with `diverged` and dropped. A checkpoint
holds every remaining member's simulation state, loaded with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import torch

from autofl.config import Experiment
from autofl.engine.simulation import Simulation
from autofl.experiment import build_experiment
from autofl.features import ClassStats
from autofl.population import Population
from autofl.registry import load_plugins
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.strategy.objectives import DEFAULT_OBJECTIVE
from autofl.tuning.strategy.space import experiment_dict
from autofl.tuning.tune.trainable import FLTrainable, TrialOutOfGPUMemory, trial_device

STATE_FILE = "population.pt"
logger = logging.getLogger(__name__)


class PopulationTrainable(FLTrainable):
    """A trainable over several configs trained as one `Population`: `_members(config)` lists them
    (dicts with an `id` and the searched `params`); `_finished()` names those to drop before a round."""

    report_finals = False  # the last result also lists every member's last entry (`finals`)

    def setup(  # the study's keywords, plus the objective
        self,
        config: dict[str, Any],
        *args: Any,
        objective: str = DEFAULT_OBJECTIVE,
        mode: str = "max",
        **kwargs: Any,
    ) -> None:
        self._objective, self._mode = objective, mode
        super().setup(config, *args, **kwargs)

    def _members(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _finished(self) -> set[str]:
        """Ids of members that need no further round."""
        return set()

    def _simulation(self, config: dict[str, Any]) -> Simulation:  # the first member's: FLTrainable's fields
        load_plugins()
        self.members: list[dict[str, Any]] = self._members(config)
        self._initial = {str(m["id"]) for m in self.members}  # those its config lists
        self._width = int(config.get("width") or len(self.members))  # a refilled cohort is refilled up to it
        self._refill = bool(config.get("refill"))  # the searcher adds members as members leave
        self._gone: set[str] = set()  # members this worker dropped (pruned, finished, failed)
        self._finals: dict[str, dict[str, Any]] = {}  # each member's last reported entry
        self.population = self._new_population(self._experiments(self.members))
        return self.population.sims[0]

    def _experiments(self, members: list[dict[str, Any]]) -> list[Experiment]:
        return [build_experiment(experiment_dict(self._base, m["params"], self._method_base)) for m in members]

    def _new_population(self, experiments: list[Experiment]) -> Population:
        # the shared dataset, unless the dataset itself is searched
        raw = self._raw if self._raw is not None and self._raw.name == experiments[0].data.dataset else None
        return Population(experiments, raw=raw, device=trial_device(), sealed_test=self._seal_test)

    def _keep(self, ids: list[str]) -> None:
        """Go on with the members `ids` (in the cohort's order)."""
        indices = [i for i, m in enumerate(self.members) if m["id"] in ids]
        self._gone |= {str(m["id"]) for m in self.members if m["id"] not in ids}
        self.population.keep(indices)
        self.members = [self.members[i] for i in indices]
        if self.population.sims:
            self.sim = self.population.sims[0]

    def _joining(self) -> list[dict[str, Any]]:
        """Members to add before this round (`{"id", "number", "params"}`): none by default."""
        return []

    def _add(self, joining: list[dict[str, Any]]) -> None:
        """Add `joining` as members from their first round, after those the cohort holds."""
        known = {str(m["id"]) for m in self.members} | self._gone
        new = [dict(m) for m in joining if str(m["id"]) not in known]
        if not new:
            return
        experiments = self._experiments(new)
        if self.members:
            self.population.add(experiments)
        else:  # every earlier member left: the new ones start a population of their own
            self.population = self._new_population(experiments)
        self.members += new
        self.sim = self.population.sims[0]

    def _drop_finished(self) -> None:
        finished = self._finished()
        if finished:
            self._keep([m["id"] for m in self.members if m["id"] not in finished])

    def step(self) -> dict[str, Any]:
        if self.population.done() and self.last is not None:  # restored from the final checkpoint
            return {**self.last, "node_id": self._node_id, "done": True, "should_checkpoint": False}
        self._drop_finished()
        if self._refill and len(self.members) < self._width:  # only a member that left makes room for one
            self._add(self._joining())
        if not self.members:  # every member pruned or failed (a driver killed after it closed them): no round
            last = self.last or {"round": 0, self._objective: math.nan}  # Tune checks a result for its metric
            return {**last, "members": [], "node_id": self._node_id, "done": True, "should_checkpoint": False}
        start = time.perf_counter()
        results: list[dict[str, float] | None] = [None]
        while all(r is None for r in results) and not self.population.done():
            try:
                results = self.population.run_round()
            except torch.OutOfMemoryError as err:
                raise TrialOutOfGPUMemory(self.sim.device, err) from None
        reported, going_on = [], []
        for member, sim, metrics in zip(self.members, self.population.sims, results):
            if metrics is None:  # not evaluated this round (fl.eval_every), or trained every round already
                if not sim.done():
                    going_on.append(member["id"])
                continue
            entry = {**{k: v for k, v in member.items() if k != "params"}, **metrics}
            if not math.isfinite(metrics["train_loss"]):  # this member fails alone; the cohort goes on
                entry["diverged"] = f"diverged at round {metrics['round']}: train_loss is {metrics['train_loss']}"
            elif not sim.done():
                going_on.append(member["id"])
            reported.append(entry)
        if not reported:  # every member had trained all its rounds (a checkpoint from before members left)
            self._keep([])
            last = self.last or {"round": 0, self._objective: math.nan}
            return {**last, "members": [], "node_id": self._node_id, "done": True, "should_checkpoint": False}
        rnd = int(reported[0]["round"])
        self._finals.update({str(e["id"]): e for e in reported})
        self._keep(going_on)  # a member that trained every round leaves (the searcher closes it)
        done = not self.members
        self.last = {"round": rnd, **self._best(reported), "members": reported}
        if done and self.report_finals:
            self.last["finals"] = list(self._finals.values())
        self._unsaved_s += time.perf_counter() - start
        due = self._unsaved_s >= self._checkpoint_every_s and not done
        return {**self.last, "node_id": self._node_id, "done": done, "should_checkpoint": due}

    def _best(self, reported: list[dict[str, Any]]) -> dict[str, Any]:
        """The metrics of the member whose objective is best (top level of a result, for Tune)."""
        metric = self._objective
        ok = [e for e in reported if "diverged" not in e and metric in e and math.isfinite(e[metric])]
        if not ok:
            return {k: v for k, v in reported[0].items() if k not in ("id", "number", "run")}
        best = (min if self._mode == "min" else max)(ok, key=lambda e: e[metric])
        return {k: v for k, v in best.items() if k not in ("id", "number", "run", "diverged")}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        state = {
            "members": [str(m["id"]) for m in self.members],
            # the members it added (a refilled cohort): their numbers and params, which its config lacks
            "added": [m for m in self.members if m["id"] not in self._initial],
            "states": [sim.state_dict() for sim in self.population.sims],
            "last": self.last,
        }
        torch.save(state, os.path.join(checkpoint_dir, STATE_FILE))
        self._unsaved_s = 0.0

    def load_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        with torch.serialization.safe_globals([ClassStats]):
            state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=True)
        self._add(list(state.get("added", [])))
        self._keep(list(state["members"]))
        for sim, sim_state in zip(self.population.sims, state["states"]):
            sim.load_state_dict(sim_state)
        self.last = state["last"]


class CohortTrainable(PopulationTrainable):
    """A study's population trial: config `{"members": [{"id", "number", "params"}, ...]}`; before each
    round it drops the members the study has finished (ASHA pruned them)."""

    def setup(self, config: dict[str, Any], *args: Any, study_root: str = "", **kwargs: Any) -> None:
        self._ledger = Ledger(study_root)  # read only: which members the study has finished
        self._read_failed = False
        super().setup(config, *args, **kwargs)

    def _members(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(m) for m in config["members"]]

    def _joining(self) -> list[dict[str, Any]]:
        """The members the searcher assigned to this cohort to join by now (a refilled cohort): read from
        the study's running trials; a worker that cannot read the storage adds none (logged once)."""
        try:
            return self._ledger.joining_members(self.trial_id, self.iteration)
        except Exception as err:  # noqa: BLE001 - any storage error (SQL, journal, a password): logged once
            if not self._read_failed:
                self._read_failed = True
                logger.warning("population trial: cannot read the study's storage (%s); no member joins", err)
            return []

    def _finished(self) -> set[str]:
        """Best effort: a worker that cannot read the study's storage (a node without the driver's access)
        trains its pruned members on, and the driver ignores what they report (the ledger's `report` of a
        finished trial, the scheduler's first look at a member)."""
        try:
            finished = self._ledger.finished_numbers(int(m["number"]) for m in self.members)
        except Exception as err:  # noqa: BLE001 - any storage error (SQL, journal, a password): logged once, training goes on
            if not self._read_failed:
                self._read_failed = True
                logger.warning("population trial: cannot read the study's storage (%s); pruned members train on", err)
            return set()
        return {str(m["id"]) for m in self.members if int(m["number"]) in finished}


class RunListCohortTrainable(PopulationTrainable):
    """Re-evaluation's runs that share every non-fusible value (their seed included), as one population:
    config `{"cohort": c}` trains `runs[i]` for each i of `cohorts[c]`; its last result lists each run's
    last entry under `finals`, with the run's index as `run`."""

    report_finals = True

    def setup(
        self,
        config: dict[str, Any],
        *args: Any,
        runs: list[dict[str, Any]] | None = None,
        cohorts: list[list[int]] | None = None,
        **kwargs: Any,
    ) -> None:
        self._runs, self._cohorts = runs or [], cohorts or []
        super().setup(config, *args, **kwargs)

    def _members(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"id": str(i), "run": i, "params": self._runs[i]} for i in self._cohorts[config["cohort"]]]

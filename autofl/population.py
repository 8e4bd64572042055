"""Population trials: several configs of one method trained as one batched model.

`train_population(experiments)` trains C experiments that differ only in fusible values (fields
declared with `json_schema_extra=autofl.config.FUSIBLE`: fl.lr, fl.momentum, fl.weight_decay,
fl.lr_decay and the method's own, e.g. FedProx's mu) and returns each one's evaluated rounds, the
same values each gives trained alone. Each config keeps its own simulation (its global model, its
clients' states, its server state, its evaluation); only the rounds' local training is shared: the
C configs x K sampled clients run as one vmapped model (`autofl.accel.population`).

A method whose class does not declare `population_ready` (its losses may read per-config values
other than through `Method.fused`), or a model the vectorized executor cannot batch, runs each config
alone, one after another: populations of one. A population's steps are the vectorized executor's
whatever `runtime.executor` says; on CPU they compile as `runtime.compile` says
(`population_compile`), on CUDA they run eagerly.

This is a composition root (as autofl.training is): it resolves the method class from the registry
and hands it to the engine.
"""

from __future__ import annotations

from typing import Any

import torch

from autofl.accel.choice import vectorizable
from autofl.accel.compiled import choose_compile
from autofl.accel.population import Member, PopulationExecutor
from autofl.config import Experiment, FLConfig, fusible_fields
from autofl.data.datasets import RawDataset, load_raw_dataset
from autofl.engine.simulation import Simulation
from autofl.errors import ConfigError
from autofl.methods.registry import get_method_class

# keys members may differ in without changing what they run (labels, not settings)
IGNORED = ("metadata",)


def flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A config dumped as dotted keys (`fl.lr` -> 0.05)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: obj}


def fusible_keys(method_cls: Any) -> tuple[str, ...]:
    """The dotted keys members of a population of `method_cls` may differ in."""
    return (
        *(f"fl.{n}" for n in fusible_fields(FLConfig)),
        *(f"method.{n}" for n in fusible_fields(method_cls.Params)),
    )


def check_population(experiments: list[Experiment]) -> Any:
    """The method class shared by `experiments`; a ConfigError naming the first key (in config
    order) in which a member differs from the first one without that key being fusible."""
    if not experiments:
        raise ConfigError("population: no experiments; give at least one")
    name = experiments[0].method.name
    for i, exp in enumerate(experiments[1:], start=1):
        if exp.method.name != name:
            raise ConfigError(
                f"population: member {i} has method.name={exp.method.name!r}, member 0 {name!r}; "
                "a population is configs of one method"
            )
    method_cls = get_method_class(name)
    allowed = set(fusible_keys(method_cls))
    base = flat(experiments[0].model_dump(mode="json"))
    for i, exp in enumerate(experiments[1:], start=1):
        other = flat(exp.model_dump(mode="json"))
        for key in [*base, *(k for k in other if k not in base)]:
            if key.split(".", 1)[0] in IGNORED or key in allowed or base.get(key) == other.get(key):
                continue
            raise ConfigError(
                f"population: member {i} has {key}={other.get(key)!r}, member 0 {base.get(key)!r}, and {key} is "
                f"not fusible; members may differ only in: {', '.join(sorted(allowed))}"
            )
    return method_cls


def population_compile(sim: Simulation, width: int) -> tuple[bool, str]:
    """Whether a population of `width` members like `sim` runs its steps compiled, and why: on CPU its
    members' `runtime.compile` decides as for one trial (`compiled.choose_compile`), with a step counted
    `width` times (a population's step does the work of `width` trials' steps, so it pays the compile
    time `width` times sooner); on CUDA its steps stay eager (not graphed yet)."""
    if sim.device.type != "cpu":
        return False, "population steps: eager (on CUDA a population's steps are not graphed yet)"
    on, why = choose_compile(
        sim.exp.runtime.compile, sim.device, sim.exp.fl.rounds, "vectorized", sim.lockstep_steps_per_round() * width
    )
    return on, f"population steps: {'compiled' if on else 'eager'} ({why}; a step counts {width} members)"


class Population:
    """C simulations of configs that differ only in fusible values, trained round by round with their
    local training shared (`run_round`), or one after another where the method is not
    `population_ready` or C is 1 (a population that compiled its steps and lost all but one member
    trains that one on through them). Members may join later (`add`) and so be at different rounds: each
    trains its own rounds until its `fl.rounds`; members at different rounds share a batched step where
    the method's step is the same at every round (`Method.same_steps_every_round`) and they sample the same
    clients, else they train in groups of equal steps (`accel.population.fused_groups`)."""

    def __init__(
        self,
        experiments: list[Experiment],
        raw: RawDataset | None = None,
        device: torch.device | None = None,
        sealed_test: bool = False,
    ):
        self.method_cls = check_population(experiments)
        self.raw = raw if raw is not None else load_raw_dataset(experiments[0].data)
        self.device = device
        self.sealed_test = sealed_test  # a search's members, whose data hold no test split (as a search trial's)
        self.sims: list[Simulation] = []
        self.flags: list[dict[str, float]] = []
        self._new_members(experiments)
        # a model the vectorized executor cannot batch (`vectorizable`) trains each config alone too
        self.ready = (
            bool(getattr(self.method_cls, "population_ready", False)) and vectorizable(self.sims[0].workspace) is None
        )
        # members at different rounds may share a batched step (`Method.same_steps_every_round`)
        self.same_steps = bool(getattr(self.method_cls, "same_steps_every_round", False))
        # decided once, for the population's first width: a population that compiles goes on compiled
        # as it loses members (`keep`), down to one, whose run alone might not compile (`auto` counts
        # one member's steps)
        self.compile_steps, self.compile_line = (
            population_compile(self.sims[0], len(self.sims)) if self.ready else (False, "")
        )
        self.first_width = len(self.sims)
        self._build_executor()

    def _new_members(self, experiments: list[Experiment]) -> None:
        sims: list[Simulation] = []
        for exp in experiments:  # one data set: the members' data configs and seeds are the same
            shared = (self.sims or sims)[0].data if self.sims or sims else None
            sims.append(
                Simulation(exp, self.method_cls, self.raw, self.device, sealed_test=self.sealed_test, data=shared)
            )
        names = fusible_fields(self.method_cls.Params)
        self.sims += sims
        self.flags += [{f"method.{n}": float(exp.method.params()[n]) for n in names} for exp in experiments]

    def add(self, experiments: list[Experiment]) -> None:
        """New members, from their first round (configs that differ from the first member only in fusible
        values: a ConfigError names the first key that is not); the members so far keep their rounds."""
        check_population([self.sims[0].exp, *experiments] if self.sims else experiments)
        self._new_members(experiments)
        self._build_executor()

    def _build_executor(self) -> None:
        # one member left of a compiled population trains on through its steps; a population of one from
        # the start is its config run alone (`autofl train`'s executor, exactly)
        shrunk_to_one = len(self.sims) == 1 and self.first_width > 1 and self.compile_steps
        self.fused = self.ready and (len(self.sims) > 1 or shrunk_to_one)
        self.executor = PopulationExecutor(self.sims[0].workspace, self.compile_steps) if self.fused else None

    def keep(self, members: list[int]) -> None:
        """Go on with only `members` (indices, in order): the others (pruned, failed) stop costing
        compute. The kept members' simulations keep their state, so their rounds stay those of their
        runs alone."""
        self.sims = [self.sims[i] for i in members]
        self.flags = [self.flags[i] for i in members]
        if self.sims:
            self._build_executor()

    def run_round(self) -> list[dict[str, float] | None]:
        """One round of every member that has rounds left: each one's metrics when its round is evaluated,
        else None (None too for a member that is done)."""
        going = [i for i, sim in enumerate(self.sims) if not sim.done()]
        results: list[dict[str, float] | None] = [None] * len(self.sims)
        if self.executor is None:
            for i in going:
                results[i] = self.sims[i].run_round()
            return results
        members, rng = [], []
        for i in going:
            sim = self.sims[i]
            step_key = None if self.same_steps else sim.round  # a method's step may change with the round
            jobs, plan = sim.begin_round()
            members.append(Member(plan, jobs, self.flags[i], step_key))
            rng.append(torch.get_rng_state())  # each member finishes its round from its own draws
        data = self.sims[0].data
        outcomes = self.executor.train(members, data.x, data.y)
        for i, member, state, outs in zip(going, members, rng, outcomes):
            torch.set_rng_state(state)
            results[i] = self.sims[i].finish_round(member.jobs, outs)
        return results

    def done(self) -> bool:
        return all(sim.done() for sim in self.sims)

    def run(self) -> list[list[dict[str, float]]]:
        """Every member's evaluated rounds, to the end of `fl.rounds`."""
        if self.executor is None:  # each config alone, as `autofl train` runs it
            return [list(sim.run()) for sim in self.sims]
        histories: list[list[dict[str, float]]] = [[] for _ in self.sims]
        while not self.done():
            for history, metrics in zip(histories, self.run_round()):
                if metrics is not None:
                    history.append(metrics)
        return histories


def train_population(
    experiments: list[Experiment], raw: RawDataset | None = None, device: torch.device | None = None
) -> list[list[dict[str, float]]]:
    """Train `experiments` (resolved, e.g. by `autofl.experiment.load_experiment`) as one population and
    return each one's metrics of every evaluated round, in their order: the values each gives trained
    alone with the vectorized executor. Raises ConfigError (one line) where they differ in a key that is
    not fusible, or in their method."""
    return Population(experiments, raw, device).run()

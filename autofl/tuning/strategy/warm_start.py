"""Warm start: a new study begins with the finished trials of another (`autofl search --space S
--warm-start OTHER`, `autofl.search(..., warm_start=OTHER)`), added through Optuna's public
`create_trial` and `Study.add_trial`, so its sampler models them from the first proposal.

A trial of OTHER is taken when it is COMPLETE, or PRUNED with per-round values of this study's one
objective, and it is a trial of the new space:

- every searched param of the new space has a value in the new space's range (a param the old
  trial did not search is back-filled with the value it trained with: its recorded config's,
  which is its study's base value);
- the config the new study would train for those values is the one the old trial trained
  (the runtime section, the dataset's folder and `metadata` aside): a param the new space fixes at
  another value, another dataset, seed or round count are reasons to skip it;
- it reported every metric the new study optimizes (its values are read from the metrics it
  reported, so the new study may optimize another validation metric than OTHER did).

Each taken trial carries the user attr `warm_start_from` ("OTHER#<number>"), its reported metrics
and recorded config, and, in a constrained study, the new space's constraint values. It trained
nothing here: it counts against no trial budget (`autofl.tuning.store.ledger.counted`) or round budget,
and a proposal of its config is told its outcome instead of training (`sampler.skip_repeats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofl.errors import AutoFLError
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.store.study import CONFIG_ATTR, open_study, resolved_config
from autofl.tuning.strategy.constraints import FEASIBLE_ATTR, constraint_values
from autofl.tuning.strategy.objectives import REPORTED_KEYS, TEST_METRICS
from autofl.tuning.strategy.repeats import config_key, is_repeat
from autofl.tuning.strategy.space import CONDITIONAL_SEP, ParamSpec, SearchSpace, all_params

WARM_ATTR = "warm_start_from"
META_KEY = "warm_start"  # study.json: where from, how many taken, the line shown
SHOWN_REASONS = 5  # skipped trials named in the one line; the rest are counted
# config sections that do not change what a trial learns (where it ran, where its data lies)
IGNORED = ("runtime", "metadata", "data.root", "data.path", "data.download")


@dataclass
class WarmStart:
    source: str  # the other study's name
    taken: list[Any] = field(default_factory=list)  # optuna FrozenTrials to add
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (old trial number, why)
    finished: int = 0  # the other study's COMPLETE and PRUNED trials

    def line(self) -> str:
        """What `autofl search` prints: how many trials it took and why it skipped the rest."""
        pruned = sum(1 for t in self.taken if t.state.name == "PRUNED")
        took = f"warm start from {self.source}: took {len(self.taken)} of its {self.finished} finished trials"
        if pruned:
            took += f" ({len(self.taken) - pruned} complete, {pruned} pruned)"
        if not self.skipped:
            return took
        shown = "; ".join(f"#{n} {why}" for n, why in self.skipped[:SHOWN_REASONS])
        more = len(self.skipped) - SHOWN_REASONS
        return f"{took}; {len(self.skipped)} skipped: {shown}" + (f"; and {more} more" if more > 0 else "")


def distribution(spec: ParamSpec) -> Any:
    """Optuna's distribution of a param, as `autofl.tuning.strategy.space.suggest` asks for it."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec.type == "categorical":
        return CategoricalDistribution(spec.choices or [])
    if spec.type == "int":
        return IntDistribution(int(spec.low), int(spec.high), log=spec.log, step=int(spec.step or 1))  # type: ignore[arg-type]
    return FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)  # type: ignore[arg-type]


def misfit(name: str, spec: ParamSpec, value: Any) -> str | None:
    """Why `value` is not a value of param `name`, or None when it is."""
    shown = f"{name.split(CONDITIONAL_SEP, 1)[-1]}={value!r}"
    if spec.type == "categorical":
        return None if value in (spec.choices or []) else f"{shown} not among {spec.choices}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{shown} is not a number"
    low, high = spec.low, spec.high
    if not low <= value <= high:  # type: ignore[operator]
        return f"{shown} outside [{low:g}, {high:g}]"
    if spec.type == "int" and value != int(value):
        return f"{shown} is not a whole number"
    step = spec.step or (1 if spec.type == "int" else None)
    if step is not None:
        k = (value - low) / step  # type: ignore[operator]
        if abs(k - round(k)) > 1e-9:
            return f"{shown} is not on the grid {low:g} + k x {step:g}"
    return None


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_difference(trained: dict[str, Any], here: dict[str, Any]) -> str | None:
    """The first setting in which the config an old trial trained differs from the one this study
    would train for its values ("trained with fl.rounds=10, here 20"), or None."""
    old, new = _flat(trained), _flat(here)
    for key in sorted(set(old) | set(new)):
        if any(key == skip or key.startswith(skip + ".") for skip in IGNORED):
            continue
        if old.get(key) != new.get(key):
            return f"trained with {key}={old.get(key)!r}, here {new.get(key)!r}"
    return None


def plan(home: Path, source: str, new_name: str, space: SearchSpace) -> WarmStart:
    """What warm-starting the new study `new_name` (of `space`) from study `source` in `home`
    takes and skips. Reads only; AutoFLError (one line) for an unknown study or the study itself."""
    if source == new_name:
        raise AutoFLError(
            f"--warm-start {source}: is the study being created; allowed: another study in {home} "
            f"(add trials to a study with --resume {source} --trials N)"
        )
    try:
        other = open_study(home, source)
    except AutoFLError as err:
        raise AutoFLError(f"--warm-start: {err}") from None
    ot = other.load_optuna()
    trials = ot.get_trials(deepcopy=False) if ot is not None else []
    old_space = other.stored_space()
    warm = WarmStart(source)
    for t in trials:
        if t.state.name not in ("COMPLETE", "PRUNED"):
            continue
        warm.finished += 1
        made = _take(t, space, old_space, other, source)
        if isinstance(made, str):
            warm.skipped.append((t.number, made))
        else:
            warm.taken.append(made)
    return warm


def _take(trial: Any, space: SearchSpace, old_space: SearchSpace, other: Any, source: str) -> Any:
    """The FrozenTrial to add for `trial` of the other study, or why it is skipped."""
    import optuna

    if is_repeat(trial):
        return f"a repeat of #{trial.user_attrs['repeat_of']} (trained once, taken once)"
    attrs = trial.user_attrs
    trained = attrs.get(CONFIG_ATTR)
    if not isinstance(trained, dict):  # a study from before configs were recorded
        trained = resolved_config(old_space, dict(trial.params))
    params = _params(trial, space, trained)
    if isinstance(params, str):
        return params
    difference = config_difference(trained, resolved_config(space, params))
    if difference is not None:
        return difference
    # not its test metrics (a study made before searches sealed the test split has them): a search reads none
    copied = {k: attrs[k] for k in (*REPORTED_KEYS, CONFIG_ATTR) if k in attrs and k not in TEST_METRICS}
    copied[WARM_ATTR] = f"{source}#{trial.number}"
    distributions = {name: distribution(spec) for name, spec in _wanted(space, params).items()}
    if trial.state.name == "PRUNED":
        if space.multi_objective or old_space.multi_objective or old_space.objective != space.objective:
            return f"pruned, with per-round values of {old_space.objective}, not of {space.objective} alone"
        return optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params=params,
            distributions=distributions,
            intermediate_values=dict(trial.intermediate_values),
            user_attrs=copied,
        )
    values = [attrs.get(m) for m in space.metrics]
    missing = [m for m, v in zip(space.metrics, values) if not isinstance(v, (int, float)) or not math.isfinite(v)]
    if missing:
        return f"reported no {missing[0]}"
    constraints = constraint_values(space.parsed_constraints, attrs)
    if constraints:
        copied[FEASIBLE_ATTR] = all(v <= 0 for v in constraints.values())
    same_objective = not space.multi_objective and old_space.objective == space.objective
    return optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        values=[float(v) for v in values],
        params=params,
        distributions=distributions,
        intermediate_values=dict(trial.intermediate_values) if same_objective else None,
        user_attrs=copied,
        constraints=constraints or None,
    )


def _wanted(space: SearchSpace, params: dict[str, Any]) -> dict[str, ParamSpec]:
    """The new space's params a trial with these values has: the shared ones, and the chosen
    method's conditional ones."""
    every = all_params(space)
    method = params.get("method.name")
    return {
        name: spec
        for name, spec in every.items()
        if CONDITIONAL_SEP not in name or name.split(CONDITIONAL_SEP, 1)[0] == str(method)
    }


def _params(trial: Any, space: SearchSpace, trained: dict[str, Any]) -> dict[str, Any] | str:
    """The trial's values of the new space's params (back-filled from its config where it did
    not search one), or why it has none."""
    old = dict(trial.params)
    method = old.get("method.name", _lookup(trained, "method.name"))
    if "method.name" in space.params and not misfit("method.name", space.params["method.name"], method):
        old.setdefault("method.name", method)
    params: dict[str, Any] = {}
    for name, spec in _wanted(space, {"method.name": old.get("method.name")}).items():
        if name in old:
            value, how = old[name], ""
        else:
            value, how = _lookup(trained, name.split(CONDITIONAL_SEP, 1)[-1]), " (back-filled)"
            if value is None:
                return f"has no value of {name}"
        why = misfit(name, spec, value)
        if why is not None:
            return why + how
        params[name] = value
    return params


def apply(study: Any, warm: WarmStart) -> None:
    """Add the taken trials to the new study's Optuna study (created here with the space's
    directions) and record the line in its study.json. Adding twice adds nothing: a study that
    holds warm-started trials already (a start retried on a shared storage) is left as it is."""
    optuna_study = Ledger(study.root).create(study.space())
    if not any(WARM_ATTR in t.user_attrs for t in optuna_study.get_trials(deepcopy=False)):
        optuna_study.add_trials(warm.taken)
    meta = study.meta()
    meta[META_KEY] = {"from": warm.source, "taken": len(warm.taken), "skipped": len(warm.skipped), "line": warm.line()}
    study.write_meta(meta)


def warm_configs(trials: list[Any]) -> set[tuple]:
    """The configs (as `repeats.config_key`) of a study's warm-started trials."""
    return {config_key(t.params) for t in trials if WARM_ATTR in t.user_attrs}

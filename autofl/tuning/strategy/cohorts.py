"""Cohorts: the configs one population trial trains together (`resources.population` > 1).

A cohort is up to `population` configs of one method that agree on every non-fusible value
(autofl.population: fusible values such as fl.lr or FedProx's mu may differ between the members of
one batched model; the architecture, the batch size, the rounds, the method may not). Its first
member is asked as any trial is; the others are asked with the first one's non-fusible params fixed
(`fixed_params`, the ledger's `ask_member`), so the sampler proposes only their fusible values. Every
member is its own Optuna trial, tagged with its member id (`member_id`): per-round values, ASHA's
rungs, budgets and states are kept per member exactly as for a trial of its own.

A method that does not declare `population_ready` (its losses read per-config values other than
through `Method.fused`) forms cohorts of one: each of its configs trains alone, as today.

Refilled cohorts: with ASHA (or Hyperband) a cohort loses members as they are pruned, and its survivors
would train on alone, each narrower width compiling its steps anew. Where a cohort's members at
different rounds still share one batched step (`refills`: a method whose step is the same at every
round, every client sampled every round, every round evaluated), the searcher asks a new member for
each one that leaves (`StudySearcher`), tagged with the next member id of the cohort and the cohort's
training iteration after which it joins; the cohort's worker adds it then (the ledger's
`joining_members`), from its first round. So a cohort keeps its width until the study's budget is
asked, and one Tune trial per slot trains most of a study.
"""

from __future__ import annotations

import json
from typing import Any

from autofl.tuning.strategy.space import CONDITIONAL_SEP, experiment_dict

MEMBER_SEP = ":m"  # a member's id: its cohort's Tune trial id, this, its index


def member_id(tune_trial_id: str, index: int) -> str:
    return f"{tune_trial_id}{MEMBER_SEP}{index}"


def cohort_of(member: str) -> str:
    """The Tune trial id of the cohort a member id belongs to (the id itself for a trial of its own)."""
    return member.rsplit(MEMBER_SEP, 1)[0] if MEMBER_SEP in member else member


def member_index(member: str) -> int:
    """A member id's index in its cohort (0 for a trial of its own)."""
    return int(member.rsplit(MEMBER_SEP, 1)[1]) if MEMBER_SEP in member else 0


def method_name(params: dict[str, Any], base: dict[str, Any]) -> str:
    return str(params.get("method.name", (base.get("method") or {}).get("name", "fedavg")))


def fixed_params(params: dict[str, Any], base: dict[str, Any]) -> dict[str, Any] | None:
    """Of a cohort's first member's params (Optuna names, '<method>:' prefixed where conditional),
    those its other members must share: every param that is not a fusible value of its method.
    None when its method cannot train configs together (a cohort of one)."""
    from autofl.methods.registry import get_method_class  # lazy: pulls torch
    from autofl.population import fusible_keys  # lazy: pulls torch

    method_cls = get_method_class(method_name(params, base))
    if not getattr(method_cls, "population_ready", False):
        return None
    fusible = set(fusible_keys(method_cls))
    return {k: v for k, v in params.items() if k.split(CONDITIONAL_SEP, 1)[-1] not in fusible}


def refills(params: dict[str, Any], base: dict[str, Any], method_base: dict[str, dict[str, Any]]) -> bool:
    """Whether a cohort whose first member has `params` is refilled as its members leave: its members at
    different rounds train as one batched model (the method is `population_ready` and declares
    `same_steps_every_round`, and every round samples every client) and report every round (fl.eval_every
    1, so each member's value reaches ASHA at each of its rounds)."""
    from autofl.experiment import build_experiment  # lazy: pulls torch
    from autofl.methods.registry import get_method_class  # lazy: pulls torch

    exp = build_experiment(experiment_dict(base, params, method_base))
    method_cls = get_method_class(exp.method.name)
    return (
        bool(getattr(method_cls, "population_ready", False))
        and bool(getattr(method_cls, "same_steps_every_round", False))
        and exp.clients_per_round() == exp.data.training_clients()
        and exp.fl.eval_every == 1
    )


def member_results(trial_id: str, result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(ledger id, result) of each config a Tune result is about: a cohort's members (each with its
    own metrics and the round), else the trial itself."""
    members = result.get("members")
    if not isinstance(members, list):
        return [(trial_id, result)]
    return [(str(m["id"]), {"round": result.get("round"), **m}) for m in members]


def group_configs(
    base: dict[str, Any], method_base: dict[str, dict[str, Any]], configs: list[dict[str, Any]], width: int
) -> list[list[int]]:
    """Indices of `configs` (searched values, a seed among them) in cohorts of at most `width` that
    share every value that is not fusible for their method (re-evaluation's runs: the candidates of
    one seed), in their order; a config whose method cannot train configs together is alone."""
    from autofl.experiment import build_experiment  # lazy: pulls torch
    from autofl.methods.registry import get_method_class  # lazy: pulls torch
    from autofl.population import IGNORED, flat, fusible_keys  # lazy: pulls torch

    groups: dict[str, list[int]] = {}
    for i, values in enumerate(configs):
        exp = build_experiment(experiment_dict(base, values, method_base))
        method_cls = get_method_class(exp.method.name)
        if width <= 1 or not getattr(method_cls, "population_ready", False):
            groups[f"alone-{i}"] = [i]
            continue
        fusible = set(fusible_keys(method_cls))
        shared = {
            k: v
            for k, v in flat(exp.model_dump(mode="json")).items()
            if k not in fusible and k.split(".", 1)[0] not in IGNORED
        }
        groups.setdefault(json.dumps(shared, sort_keys=True, default=str), []).append(i)
    return [members[j : j + width] for members in groups.values() for j in range(0, len(members), width)]

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

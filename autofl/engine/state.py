"""State dicts: copying and averaging them (the server's and the executors' common currency)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

StateDict = dict[str, torch.Tensor]


def clone_state(model: nn.Module, keys: list[str] | None = None) -> StateDict:
    state = model.state_dict()
    return {k: state[k].detach().clone() for k in (keys if keys is not None else state)}


def weighted_average(states: list[StateDict], weights: list[float]) -> StateDict:
    """sum_i w_i * state_i per key, with the weights normalised; integer buffers are rounded back."""
    total = float(sum(weights))
    norm = torch.tensor([w / total for w in weights], dtype=torch.float64)
    out: StateDict = {}
    for key in states[0]:
        stacked = torch.stack([s[key].to(torch.float64) for s in states])
        mean = torch.tensordot(norm.to(stacked.device), stacked, dims=1)
        ref = states[0][key]
        out[key] = (mean.round() if not ref.is_floating_point() else mean).to(ref.dtype)
    return out


def map_tree(obj: Any, leaf: Callable[[Any], Any], dataclasses_as_dicts: bool = False) -> Any:
    """`obj` with `leaf` applied to everything that is not a dataclass, dict, list or tuple, which
    are rebuilt around the results (a dataclass as a dict of its fields if `dataclasses_as_dicts`)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: map_tree(getattr(obj, f.name), leaf, dataclasses_as_dicts) for f in dataclasses.fields(obj)}
        return fields if dataclasses_as_dicts else dataclasses.replace(obj, **fields)
    if isinstance(obj, dict):
        return {k: map_tree(v, leaf, dataclasses_as_dicts) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tree(v, leaf, dataclasses_as_dicts) for v in obj)
    return leaf(obj)


def plain_tree(obj: Any) -> Any:
    """`obj` with every dataclass (e.g. FedFCD's ClassStats) turned into a dict of its
    fields, recursively: a file saved from it loads with `torch.load(path, weights_only=True)` in
    any Python that has torch, without allow-listing autofl's classes."""
    return map_tree(obj, lambda x: x, dataclasses_as_dicts=True)

"""State dicts: copying and averaging them (the server's and the executors' common currency)."""

from __future__ import annotations

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

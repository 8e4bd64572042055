"""Where tensors live: the one rule that turns a device setting into a `torch.device`."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """`runtime.device` (auto, cpu, cuda, cuda:N) as a torch.device; "auto" is cuda when torch
    sees a GPU, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

"""What a run costs: bytes between server and clients, training FLOPs, and rounds to a target.

Bytes are counted from the values that travel in the simulation, each tensor as numel x
element_size (a float32 entry is 4 bytes, an int64 buffer 8, a bool mask 1):

- download, per sampled client per round: the global state's entries the client receives
  (`Method.received_keys`: the shared keys and those its `sharing` says the server trains) plus the method's `server_payload`
  (global prototypes, GFRs ...);
- upload, per sampled client per round: its `Upload.state` (the shared keys after training) plus
  the tensors of the method's `upload_payload` (prototypes, class statistics);
- a server hook whose work stands for client traffic (statistics the simulation computes from
  every client's data on the server) adds that traffic through `ServerUpdate.upload_bytes` /
  `download_bytes`.

Evaluation traffic (personal models tested on every client) is not counted: it measures the
run, it is not part of training.

FLOPs are an estimate: `train_flops_per_sample` counts one forward and backward pass of the whole
model on one sample (torch.utils.flop_counter.FlopCounterMode on a meta-device copy: no memory,
no compute, the real model untouched); a round costs that times the samples each update of each
stage passes over, summed over the round's sampled clients (`round_samples`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from autofl.engine.executor import batch_cuts
from autofl.engine.plan import Stage

# the cost keys of a round's metrics (autofl.engine.metric_keys lists them without torch)
UPLOAD, DOWNLOAD = "upload_bytes", "download_bytes"


def tensor_bytes(tree: Any) -> int:
    """numel x element_size summed over every tensor in `tree` (tensors, mappings, lists, tuples,
    dataclasses such as `ClassStats`); anything else (None, numbers) counts 0."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return sum(tensor_bytes(getattr(tree, f.name)) for f in dataclasses.fields(tree))
    if isinstance(tree, Mapping):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def train_flops_per_sample(model: torch.nn.Module, input_shape: Sequence[int], num_classes: int) -> int | None:
    """FLOPs of one forward and backward pass of `model` (every parameter trained, cross-entropy
    loss) per sample, as FlopCounterMode counts them (matrix products and convolutions). Measured
    on a batch of 2 (a training-mode BatchNorm needs 2) of a meta-device copy: nothing is computed,
    and the model, its statistics and the RNG are left as they were. None when the model cannot run
    on the meta device (a plugin's forward that reads a value): an estimate never stops a run."""
    try:
        probe = copy.deepcopy(model).to("meta")
        probe.train()
        dtype = next((p.dtype for p in probe.parameters()), torch.float32)
        x = torch.zeros(2, *input_shape, dtype=dtype, device="meta")
        y = torch.zeros(2, dtype=torch.int64, device="meta")
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(probe(x), y.clamp(max=num_classes - 1)).backward()
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None
    return int(counter.get_total_flops()) // 2


def round_samples(stages: Iterable[Stage], client_sizes: Iterable[int], local_epochs: int, batch_size: int) -> int:
    """Samples the round's optimizer steps pass over: per client, per stage, epochs x updates x the
    samples of the client's batches (a lone last sample dropped, as the executors do)."""
    stages = list(stages)
    total = 0
    for n in client_sizes:
        per_epoch = sum(b - a for a, b in batch_cuts(n, batch_size))
        for stage in stages:
            epochs = stage.epochs if stage.epochs is not None else local_epochs
            total += epochs * len(stage.updates) * per_epoch
    return total


def rounds_to_target(history: Iterable[Mapping[str, Any]], metric: str, target: float) -> int | None:
    """The first evaluated round whose `metric` reaches `target` (>=), or None if none does yet."""
    for metrics in history:
        value = metrics.get(metric)
        if value is not None and value >= target:
            return int(metrics["round"])
    return None


@dataclasses.dataclass
class RunCost:
    """A run's cost so far: bytes uploaded and downloaded, training FLOPs (all cumulative; FLOPs
    None where the model's could not be counted)."""

    upload_bytes: int = 0
    download_bytes: int = 0
    train_flops: int | None = 0

    def metrics(self, rounds_done: int) -> dict[str, float]:
        """The cost keys of a round's metrics: totals so far and their means per round done."""
        per = max(rounds_done, 1)
        out: dict[str, float] = {
            UPLOAD: self.upload_bytes,
            DOWNLOAD: self.download_bytes,
            "upload_bytes_per_round": self.upload_bytes / per,
            "download_bytes_per_round": self.download_bytes / per,
        }
        if self.train_flops is not None:
            out.update({"train_flops": self.train_flops, "flops_per_round": self.train_flops / per})
        return out

    def state(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)

"""Partition sample indices over clients: iid, dirichlet(alpha) with min_size, pathological(k)."""

from __future__ import annotations

import numpy as np

from autofl.config import PartitionConfig
from autofl.errors import ConfigError

_MAX_DIRICHLET_TRIES = 1000


def partition_iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def partition_dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per class, proportions ~ Dir(alpha) over clients; resample until every client has min_size."""
    if min_size * num_clients > len(labels):
        raise ConfigError(
            f"data.min_size: {min_size} x {num_clients} clients exceeds the "
            f"{len(labels)} samples; allowed 0..{len(labels) // num_clients}"
        )
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(_MAX_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        result = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in result) >= min_size:
            return result
    raise ConfigError(
        f"data.min_size: no Dirichlet(alpha={alpha}) draw gave every client {min_size} samples "
        f"in {_MAX_DIRICHLET_TRIES} tries; lower data.min_size or raise data.partition.alpha"
    )


def partition_pathological(
    labels: np.ndarray, num_clients: int, k: int, rng: np.random.Generator, in_order: bool = False
) -> list[np.ndarray]:
    """Each client holds exactly k classes; a class's samples are split evenly among its holders.
    Client i takes classes i*k .. i*k+k-1 (mod C) of the labels shuffled by `rng`, or of the labels
    in order (`in_order`, PFLlib's assignment: with 20 clients and k=2 every client holds one of
    the pairs {0,1}, {2,3}, ... {8,9})."""
    classes = np.unique(labels)
    if k > len(classes) or k * num_clients < len(classes):
        raise ConfigError(
            f"data.partition.classes_per_client: {k} does not fit {num_clients} clients and "
            f"{len(classes)} classes; allowed {-(-len(classes) // num_clients)}..{len(classes)}"
        )
    order = classes if in_order else rng.permutation(classes)
    # client i takes k consecutive classes of a shuffled cycle: distinct, and every class is held
    held = [order[(i * k + j) % len(classes)] for i in range(num_clients) for j in range(k)]
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for slot, cls in enumerate(held):
        holders[int(cls)].append(slot // k)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls, owners in holders.items():
        idx = rng.permutation(np.flatnonzero(labels == cls))
        for owner, chunk in zip(owners, np.array_split(idx, len(owners))):
            parts[owner].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def partition_indices(
    labels: np.ndarray, num_clients: int, cfg: PartitionConfig, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    if cfg.kind == "iid":
        return partition_iid(labels, num_clients, rng)
    if cfg.kind == "dirichlet":
        return partition_dirichlet(labels, num_clients, cfg.alpha, min_size, rng)
    return partition_pathological(
        labels, num_clients, cfg.classes_per_client, rng, in_order=cfg.class_order == "in_order"
    )

"""A partitioned dataset: one pooled tensor pair plus per-client train / val / test index tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from autofl.config import DataConfig
from autofl.data.datasets import RawDataset
from autofl.data.partition import partition_indices
from autofl.errors import ConfigError
from autofl.seeding import SeedPurpose


@dataclass
class ClientSplit:
    train: torch.Tensor  # indices into FederatedData.x
    val: torch.Tensor
    test: torch.Tensor

    def to(self, device: torch.device) -> ClientSplit:
        return ClientSplit(self.train.to(device), self.val.to(device), self.test.to(device))


@dataclass
class FederatedData:
    x: torch.Tensor  # the pool that was partitioned
    y: torch.Tensor
    clients: list[ClientSplit]
    test_x: torch.Tensor  # the global test set
    test_y: torch.Tensor
    num_classes: int
    # clients held out of training (data.holdout_clients): personalized as newcomers and tested
    newcomers: list[ClientSplit] = field(default_factory=list)
    # rows(): the rows of an index tensor the data keeps (a client's val or test split), gathered once
    _gathered: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _all_val: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)  # all_val_rows' index

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(x[index], y[index])` for one of this data's own index tensors (a client's or newcomer's val
        or test split), gathered at its first read and kept: evaluation reads every client's splits
        at every evaluated round, and gathering them anew was a third of a round's evaluation (an mlp
        on MNIST, 100 clients; 2026-11-29). Costs the splits' rows once more in memory."""
        kept = self._gathered.get(id(index))
        if kept is None or kept[0] is not index:  # the identity check: an id is reused only after its tensor is gone
            kept = (index, self.x.index_select(0, index), self.y.index_select(0, index))
            self._gathered[id(index)] = kept
        return kept[1], kept[2]

    def all_val_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of every training client's val split, in client order (the global model's
        validation), gathered once as `rows` does."""
        if self._all_val is None:
            self._all_val = torch.cat([c.val for c in self.clients])
        return self.rows(self._all_val)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def without_test(self) -> FederatedData:
        """The same data with every test split empty: the clients' and newcomers' test indices and the
        global test set. What a search trial holds, so that no test sample is read before a study
        ends (the test metrics are then absent from its rounds; `autofl reeval` reads them)."""
        return FederatedData(
            self.x,
            self.y,
            [ClientSplit(c.train, c.val, c.test[:0]) for c in self.clients],
            self.test_x[:0],
            self.test_y[:0],
            self.num_classes,
            [ClientSplit(c.train, c.val, c.test[:0]) for c in self.newcomers],
        )

    def train_sizes(self) -> list[int]:
        return [len(c.train) for c in self.clients]

    def to(self, device: torch.device, dtype: torch.dtype = torch.float32) -> FederatedData:
        """On `device`, with inputs of `dtype` (labels and indices stay int64)."""
        return FederatedData(
            self.x.to(device, dtype),
            self.y.to(device),
            [c.to(device) for c in self.clients],
            self.test_x.to(device, dtype),
            self.test_y.to(device),
            self.num_classes,
            [c.to(device) for c in self.newcomers],
        )


def split_client(indices: np.ndarray, fractions: tuple[float, float, float], rng: np.random.Generator) -> ClientSplit:
    """Shuffle one client's indices and cut them into train / val / test (train keeps the remainder)."""
    shuffled = rng.permutation(indices)
    n = len(shuffled)
    n_val = round(fractions[1] * n)
    n_test = round(fractions[2] * n)
    while n > 0 and n_val + n_test > n - 1:  # tiny client: keep at least one training sample
        if n_test >= n_val:
            n_test -= 1
        else:
            n_val -= 1
    n_train = n - n_val - n_test
    as_tensor = lambda a: torch.as_tensor(np.sort(a), dtype=torch.int64)  # noqa: E731
    return ClientSplit(
        as_tensor(shuffled[:n_train]),
        as_tensor(shuffled[n_train : n_train + n_val]),
        as_tensor(shuffled[n_train + n_val :]),
    )


def natural_parts(raw: RawDataset, cfg: DataConfig) -> list[np.ndarray]:
    """Client k holds the pool's samples whose client id is k (ids 0..num_clients-1)."""
    test_ids = raw.test_client if cfg.pool == "train+test" else None
    if raw.train_client is None or (cfg.pool == "train+test" and test_ids is None):
        raise ConfigError(f"data.partition.kind: natural needs client ids in dataset {cfg.dataset}")
    ids = raw.train_client if test_ids is None else torch.cat([raw.train_client, test_ids])
    ids_np = ids.numpy()
    return [np.flatnonzero(ids_np == k) for k in range(cfg.num_clients)]


def check_split_reaches_a_client(cfg: DataConfig, sizes: list[int], clients: list[ClientSplit]) -> None:
    """ConfigError naming `data.split.<part>` when a part asked for (> 0) gives no client a sample
    (issue 42: val 0.001 on digits ended in a Ray traceback and a half-made study)."""
    largest = max(sizes, default=0)
    for part, what in (("train", "training"), ("val", "validation"), ("test", "test")):
        fraction = getattr(cfg.split, part)
        if fraction > 0 and not any(len(getattr(c, part)) for c in clients):
            need = f"; allowed: at least {1 / largest:.2g} (one sample of the largest client)" if largest else ""
            off = ", or 0 for none" if part != "train" else ""
            raise ConfigError(
                f"data.split.{part}: {fraction:g} gives no client a {what} sample (the largest of the "
                f"{len(sizes)} clients holds {largest} samples){need}{off}"
            )


def build_federated(raw: RawDataset, cfg: DataConfig, seed: int) -> FederatedData:
    """Partition and split exactly as spec §1; `seed` fixes both."""
    rng = np.random.default_rng([seed, int(SeedPurpose.PARTITION)])
    if cfg.pool == "train+test":
        x = torch.cat([raw.train_x, raw.test_x])
        y = torch.cat([raw.train_y, raw.test_y])
    else:
        x, y = raw.train_x, raw.train_y
    if cfg.partition.kind == "natural":  # the dataset's own clients (validated against num_clients)
        parts = natural_parts(raw, cfg)
    else:
        parts = partition_indices(y.numpy(), cfg.num_clients, cfg.partition, cfg.min_size, rng)
    fractions = (cfg.split.train, cfg.split.val, cfg.split.test)
    clients = [split_client(p, fractions, rng) for p in parts]
    check_split_reaches_a_client(cfg, [len(p) for p in parts], clients)
    if cfg.pool == "train+test":
        union = torch.cat([c.test for c in clients])
        test_x, test_y = x[union], y[union]
    else:
        test_x, test_y = raw.test_x, raw.test_y
    held = holdout_clients(cfg, seed)
    return FederatedData(
        x,
        y,
        [c for k, c in enumerate(clients) if k not in held],
        test_x,
        test_y,
        raw.num_classes,
        [clients[k] for k in sorted(held)],
    )


def holdout_clients(cfg: DataConfig, seed: int) -> set[int]:
    """The clients `data.holdout_clients` keeps out of training: drawn from a stream of their own, so
    the partition and every other client's split are those of the same config without a holdout."""
    count = cfg.holdout_count()
    if not count:
        return set()
    rng = np.random.default_rng([seed, int(SeedPurpose.HOLDOUT)])
    return {int(k) for k in rng.choice(cfg.num_clients, size=count, replace=False)}

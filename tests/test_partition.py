import numpy as np
import pytest

from autofl.config import DataConfig, PartitionConfig
from autofl.data.datasets import load_raw_dataset
from autofl.data.federated import build_federated
from autofl.data.partition import partition_indices

LABELS = np.repeat(np.arange(10), 50)  # 500 samples, 50 per class


def _parts(kind, seed=0, n=10, **kw):
    cfg = PartitionConfig(kind=kind, **kw)
    return partition_indices(LABELS, n, cfg, min_size=kw.pop("min_size", 10), rng=np.random.default_rng(seed))


@pytest.mark.parametrize("kind,kw", [("iid", {}), ("dirichlet", {"alpha": 0.3}), ("pathological", {"classes_per_client": 2}),
                                     ("pathological", {"classes_per_client": 3})])
def test_every_sample_assigned_exactly_once(kind, kw):
    parts = _parts(kind, **kw)
    assert len(parts) == 10
    joined = np.concatenate(parts)
    assert len(joined) == len(LABELS)
    assert np.array_equal(np.sort(joined), np.arange(len(LABELS)))


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5])
def test_dirichlet_min_size_holds(alpha):
    parts = partition_indices(LABELS, 10, PartitionConfig(kind="dirichlet", alpha=alpha), 20, np.random.default_rng(3))
    assert min(len(p) for p in parts) >= 20


@pytest.mark.parametrize("k", [1, 2, 5])
def test_pathological_gives_exactly_k_classes(k):
    parts = _parts("pathological", classes_per_client=k, n=20)
    assert all(len(np.unique(LABELS[p])) == k for p in parts)


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological"])
def test_same_seed_same_partition_different_seed_different(kind):
    a, b, c = _parts(kind, seed=1), _parts(kind, seed=1), _parts(kind, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_client_splits_are_disjoint_and_follow_fractions():
    raw = load_raw_dataset(DataConfig())
    fed = build_federated(raw, DataConfig(num_clients=5), seed=0)
    covered = []
    for c in fed.clients:
        n = len(c.train) + len(c.val) + len(c.test)
        assert abs(len(c.val) - 0.1 * n) <= 1 and abs(len(c.test) - 0.2 * n) <= 1
        covered += c.train.tolist() + c.val.tolist() + c.test.tolist()
    assert sorted(covered) == list(range(len(raw.train_y)))
    assert len(fed.test_y) == len(raw.test_y)  # pool=train: the official test set is global


def test_pool_train_plus_test_uses_union_of_client_tests_as_global_test():
    raw = load_raw_dataset(DataConfig())
    fed = build_federated(raw, DataConfig(pool="train+test", num_clients=4), seed=0)
    assert len(fed.x) == len(raw.train_y) + len(raw.test_y)
    assert len(fed.test_y) == sum(len(c.test) for c in fed.clients)


def test_pathological_in_order_gives_pfllibs_class_pairs():
    # PFLlib's assignment (FedFCD's Table 1): 20 clients, 2 classes each, the pairs {0,1}, {2,3}, ...
    # every pair held by 4 clients, a class's samples split evenly among them
    for seed in (0, 1, 2):
        parts = _parts("pathological", seed=seed, n=20, classes_per_client=2, class_order="in_order")
        held = [tuple(np.unique(LABELS[p])) for p in parts]
        assert sorted(set(held)) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
        assert all(held.count(pair) == 4 for pair in set(held))
        assert all(24 <= len(p) <= 26 for p in parts)  # 50 per class over 4 holders: 12 or 13 each
    shuffled = {tuple(np.unique(LABELS[p])) for p in _parts("pathological", seed=0, n=20, classes_per_client=2)}
    assert shuffled != {(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)}  # the default draws its pairs from the seed

"""The built-in datasets, each declared once: classes, input shape, official sizes, how to load it."""

from __future__ import annotations

from functools import partial

from autofl.data.datasets import load_digits, load_torchvision
from autofl.data.npz import load_npz
from autofl.data.spec import DatasetSpec
from autofl.registry import BUILT_IN, DATASETS


def _torchvision(
    name: str,
    cls_name: str,
    layout: str,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    num_classes: int,
    side: int,
    sizes: tuple[int, int],
) -> DatasetSpec:
    """A torchvision dataset read from data.root (files under root/layout), normalized per channel."""
    return DatasetSpec(
        name,
        partial(load_torchvision, name, cls_name, layout, mean, std),
        num_classes=num_classes,
        input_shape=(len(mean), side, side),
        train_size=sizes[0],
        test_size=sizes[1],
        description=f"torchvision {cls_name} ({layout} under data.root)",
    )


for _spec in (
    DatasetSpec(
        "digits",
        load_digits,
        num_classes=10,
        input_shape=(1, 8, 8),
        train_size=1438,
        test_size=359,
        description="scikit-learn's 8x8 digits (bundled; fixed 80/20 split), no files needed",
    ),
    _torchvision("mnist", "MNIST", "MNIST/raw", (0.1307,), (0.3081,), 10, 28, (60000, 10000)),
    _torchvision("fmnist", "FashionMNIST", "FashionMNIST/raw", (0.2860,), (0.3530,), 10, 28, (60000, 10000)),
    _torchvision(
        "cifar10",
        "CIFAR10",
        "cifar-10-batches-py",
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        10,
        32,
        (50000, 10000),
    ),
    _torchvision(
        "cifar100",
        "CIFAR100",
        "cifar-100-python",
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        100,
        32,
        (50000, 10000),
    ),
    DatasetSpec(
        "npz",
        load_npz,
        uses_path=True,
        description="arrays from the .npz at data.path: x, y [, client] [, x_test, y_test [, client_test]]",
    ),
):
    DATASETS.add(_spec, BUILT_IN)

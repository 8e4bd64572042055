"""Load a dataset once into memory as normalized float tensors (no per-sample Python at train time)."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from autofl.config import DATA_ROOT_ENV, DataConfig
from autofl.errors import DataError

# mean / std per channel used to normalize each torchvision dataset
_NORMALIZATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "fmnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_TORCHVISION_CLASS = {"mnist": "MNIST", "fmnist": "FashionMNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}
_DIGITS_TEST_FRACTION = 0.2
_DIGITS_SPLIT_SEED = 0  # digits has no official test set: a fixed split, the same for every experiment


@dataclass
class RawDataset:
    """An official train / test pair as in-memory tensors: x float32 (N, C, H, W), y int64 (N,)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def _digits_file() -> Path:
    """scikit-learn's bundled digits.csv.gz, found without importing scikit-learn (its import
    costs about 1.7 s of the quickstart's driver start; the file is all `load_digits` reads)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("dataset digits needs scikit-learn (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def _load_digits() -> RawDataset:
    table = np.loadtxt(_digits_file(), delimiter=",")  # 64 pixels (0..16) and the label per row
    x = torch.tensor(table[:, :-1], dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    x = (x - 0.3) / 0.4  # roughly zero-mean, unit-variance pixels
    y = torch.tensor(table[:, -1].astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(_DIGITS_SPLIT_SEED).permutation(len(y)))
    n_test = int(round(_DIGITS_TEST_FRACTION * len(y)))
    test_idx, train_idx = order[:n_test], order[n_test:]
    return RawDataset("digits", x[train_idx], y[train_idx], x[test_idx], y[test_idx], 10)


def _to_tensor_images(data: object) -> torch.Tensor:
    images = data if isinstance(data, torch.Tensor) else torch.from_numpy(np.asarray(data))
    if images.ndim == 3:  # (N, H, W) grayscale
        images = images.unsqueeze(1)
    else:  # (N, H, W, C) colour
        images = images.permute(0, 3, 1, 2)
    return images.contiguous().float().div_(255.0)


# where torchvision keeps each dataset's files under the root folder
_LAYOUT = {"mnist": "MNIST/raw", "fmnist": "FashionMNIST/raw", "cifar10": "cifar-10-batches-py",
           "cifar100": "cifar-100-python"}


def _load_torchvision(name: str, root: Path, download: bool) -> RawDataset:
    import pickle

    from torchvision import datasets

    cls = getattr(datasets, _TORCHVISION_CLASS[name])
    try:
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False, download=download)
    except RuntimeError as err:
        message = str(err).lower()
        if download and ("download" in message or "urlopen" in message):
            raise DataError(f"data.download: could not download {name} into {root} ({_one_line(err)}); check the "
                            f"network, or copy the files to {root}/{_LAYOUT[name]} and set data.download=false") from None
        if "not found" not in message and "corrupted" not in message:  # the files are there but unreadable
            raise _corrupt(name, root, err) from None
        raise DataError(
            f"data.dataset: {name} not found under {root.resolve()} (torchvision layout: {root}/{_LAYOUT[name]}); "
            f"set data.root or ${DATA_ROOT_ENV} to the folder that holds it, or data.download=true (a space: "
            f"base.data.download: true)"
        ) from None
    except OSError as err:  # no network, refused connection, unreadable file
        what = "download" if download else "read"
        raise DataError(f"data.dataset: could not {what} {name} under {root} ({_one_line(err)})") from None
    except (ValueError, EOFError, IndexError, pickle.UnpicklingError) as err:
        raise _corrupt(name, root, err) from None
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in _NORMALIZATION[name])
    tx = (_to_tensor_images(train.data) - mean) / std
    vx = (_to_tensor_images(test.data) - mean) / std
    ty = torch.as_tensor(np.asarray(train.targets), dtype=torch.int64)
    vy = torch.as_tensor(np.asarray(test.targets), dtype=torch.int64)
    return RawDataset(name, tx, ty, vx, vy, len(train.classes))


def _corrupt(name: str, root: Path, err: BaseException) -> DataError:
    return DataError(f"data.dataset: the {name} files under {root}/{_LAYOUT[name]} are corrupt ({type(err).__name__}: "
                     f"{_one_line(err)}); delete them and fetch them again (data.download=true)")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def load_raw_dataset(cfg: DataConfig) -> RawDataset:
    """Load `cfg.dataset` from `cfg.root` (or $AUTOFL_DATA_ROOT); digits needs no files. The last
    one loaded is kept: a search checks its dataset before it creates the study, then shares that."""
    return _load(cfg.dataset, str(cfg.resolved_root()), cfg.download)


@functools.lru_cache(maxsize=1)
def _load(name: str, root: str, download: bool) -> RawDataset:
    if name == "digits":
        return _load_digits()
    return _load_torchvision(name, Path(root), download)

"""Load a dataset once into memory as normalized float tensors (no per-sample Python at train time).

Which datasets exist, and their facts, is declared in `autofl.data.catalog` (built-ins) and by
plugins (`autofl.registry.DATASETS`); this module holds the built-in image loaders and the cache.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import torch

from autofl.config import DATA_ROOT_ENV, DataConfig
from autofl.data.raw import RawDataset
from autofl.errors import DataError
from autofl.registry import DATASETS

__all__ = ["RawDataset", "load_digits", "load_raw_dataset", "load_torchvision"]

_DIGITS_TEST_FRACTION = 0.2
_DIGITS_SPLIT_SEED = 0  # digits has no official test set: a fixed split, the same for every experiment


def _digits_file() -> Path:
    """scikit-learn's bundled digits.csv.gz, found without importing scikit-learn (its import
    costs about 1.7 s of the quickstart's driver start; the file is all `load_digits` reads)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("dataset digits needs scikit-learn (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def load_digits(cfg: DataConfig | None = None) -> RawDataset:
    """scikit-learn's 8x8 digits, split 80/20 by a fixed permutation."""
    table = np.loadtxt(_digits_file(), delimiter=",")  # 64 pixels (0..16) and the label per row
    x = torch.tensor(table[:, :-1], dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    x = (x - 0.3) / 0.4  # roughly zero-mean, unit-variance pixels
    y = torch.tensor(table[:, -1].astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(_DIGITS_SPLIT_SEED).permutation(len(y)))
    n_test = round(_DIGITS_TEST_FRACTION * len(y))
    test_idx, train_idx = order[:n_test], order[n_test:]
    return RawDataset("digits", x[train_idx], y[train_idx], x[test_idx], y[test_idx], 10)


def _to_tensor_images(data: object) -> torch.Tensor:
    images = data if isinstance(data, torch.Tensor) else torch.from_numpy(np.asarray(data))
    # (N, H, W) grayscale, or (N, H, W, C) colour
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
    return images.contiguous().float().div_(255.0)


def load_torchvision(
    name: str, cls_name: str, layout: str, mean: tuple[float, ...], std: tuple[float, ...], cfg: DataConfig
) -> RawDataset:
    """torchvision's `cls_name` from `cfg`'s root (files under `root/layout`), normalized by mean / std."""
    from torchvision import datasets

    root, download = cfg.resolved_root(), cfg.download
    cls = getattr(datasets, cls_name)
    try:
        train = cls(str(root), train=True, download=download)
        test = cls(str(root), train=False, download=download)
    except RuntimeError as err:
        message = str(err).lower()
        if download and ("download" in message or "urlopen" in message):
            raise DataError(
                f"data.download: could not download {name} into {root} ({_one_line(err)}); check the "
                f"network, or copy the files to {root}/{layout} and set data.download=false"
            ) from None
        if "not found" not in message and "corrupted" not in message:  # the files are there but unreadable
            raise _corrupt(name, root, layout, err) from None
        raise DataError(
            f"data.dataset: {name} not found under {root.resolve()} (torchvision layout: {root}/{layout}); "
            f"set data.root or ${DATA_ROOT_ENV} to the folder that holds it, or data.download=true (a space: "
            f"base.data.download: true)"
        ) from None
    except OSError as err:  # no network, refused connection, unreadable file
        what = "download" if download else "read"
        raise DataError(f"data.dataset: could not {what} {name} under {root} ({_one_line(err)})") from None
    except (
        ValueError,
        EOFError,
        IndexError,
        AssertionError,
        pickle.UnpicklingError,
    ) as err:  # torchvision asserts on bad headers
        raise _corrupt(name, root, layout, err) from None
    mean_t, std_t = (torch.tensor(v).view(1, -1, 1, 1) for v in (mean, std))
    tx = (_to_tensor_images(train.data) - mean_t) / std_t
    vx = (_to_tensor_images(test.data) - mean_t) / std_t
    ty = torch.as_tensor(np.asarray(train.targets), dtype=torch.int64)
    vy = torch.as_tensor(np.asarray(test.targets), dtype=torch.int64)
    return RawDataset(name, tx, ty, vx, vy, len(train.classes))


def _corrupt(name: str, root: Path, layout: str, err: BaseException) -> DataError:
    return DataError(
        f"data.dataset: the {name} files under {root}/{layout} are corrupt ({type(err).__name__}: "
        f"{_one_line(err)}); delete them and fetch them again (data.download=true)"
    )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


_cache: dict[tuple[object, ...], RawDataset] = {}


def load_raw_dataset(cfg: DataConfig) -> RawDataset:
    """Load `cfg.dataset` (a registered `DatasetSpec`) with `cfg`'s root, download flag and path.
    The last one loaded is kept: a search checks its dataset before it creates the study, then
    shares that; validating a config whose facts come from its file loads it once."""
    spec = DATASETS.get(cfg.dataset)
    key = (cfg.dataset, str(cfg.resolved_root()), cfg.download, cfg.path, _file_version(cfg.path))
    if key not in _cache:
        raw = spec.load(cfg)
        _cache.clear()
        _cache[key] = raw
    return _cache[key]


def _file_version(path: str | None) -> tuple[int, int] | None:
    """A file's (mtime, size): a file rewritten in place is loaded again."""
    try:
        stat = Path(path).expanduser().stat() if path else None
    except OSError:
        return None
    return None if stat is None else (stat.st_mtime_ns, stat.st_size)

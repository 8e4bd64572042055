"""The `npz` dataset: arrays from the file at `data.path`, read with `allow_pickle=False`.

The file holds
    x            (N, F), (N, H, W) or (N, C, H, W) numbers: the samples, used as they are (normalize before)
    y            (N,) integers >= 0: the labels (classes: 0 .. max label)
    client       (N,) integers, optional: the client of each sample (`data.partition.kind: natural`)
    x_test, y_test        optional, together: the global test set (same sample shape as x)
    client_test  (N_test,) integers, optional: the client of each test sample (needed by
                 `data.pool: train+test` with the natural partition)
Any problem with the file is one line naming the file and the array.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from autofl.data.raw import RawDataset
from autofl.errors import DataError

if TYPE_CHECKING:
    from autofl.config import DataConfig

ARRAYS = ("x", "y", "client", "x_test", "y_test", "client_test")
MAX_CLASSES = 100_000  # a head wider than this is a labelling mistake, not a dataset
_LAYOUT = "x, y [, client] [, x_test, y_test [, client_test]]"


def _read(path: Path) -> dict[str, np.ndarray]:
    where = f"data.path: {path}"
    if not path.is_file():
        raise DataError(f"{where}: no such file (expected an .npz with {_LAYOUT})")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError(f"{where}: is a single .npy array, not an .npz archive with {_LAYOUT}")
        with loaded as npz:
            arrays: dict[str, np.ndarray] = {}
            for name in ARRAYS:
                if name in npz.files:
                    try:
                        arrays[name] = npz[name]
                    except ValueError as err:
                        if "pickle" in str(err).lower() or "object" in str(err).lower():
                            raise DataError(f"{where}: array {name} holds pickled Python objects, which autofl does "
                                            f"not load; store numbers (e.g. float32 x, int64 y)") from None
                        raise DataError(f"{where}: array {name} cannot be read ({_one_line(err)})") from None
            return arrays
    except DataError:
        raise
    except ValueError as err:  # not a zip and not an .npy: numpy refuses to unpickle it
        if "pickle" in str(err).lower():
            raise DataError(f"{where}: is a pickle, not an .npz archive; autofl loads no pickled data") from None
        raise DataError(f"{where}: is not an .npz archive ({_one_line(err)})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{where}: cannot be read as an .npz archive ({type(err).__name__}: {_one_line(err)})") from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _check_integers(where: str, name: str, a: np.ndarray, n: int, what: str) -> None:
    if a.ndim != 1 or len(a) != n:
        raise DataError(f"{where}: array {name} has shape {a.shape}; expected ({n},), one {what} per sample")
    if not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"{where}: array {name} has dtype {a.dtype}; expected integers ({what}s)")
    if n and a.min() < 0:
        raise DataError(f"{where}: array {name} holds {a.min()}; {what}s must be >= 0")


def _samples(where: str, name: str, a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise DataError(f"{where}: array {name} has dtype {a.dtype}; expected numbers (float or integer)")
    if a.ndim not in (2, 3, 4) or a.shape[0] == 0 or 0 in a.shape[1:]:
        raise DataError(f"{where}: array {name} has shape {a.shape}; expected (N, F), (N, H, W) or (N, C, H, W) "
                        f"with N >= 1")
    x = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    if not torch.isfinite(x).all():
        raise DataError(f"{where}: array {name} holds NaN or infinite values")
    if x.ndim == 2:  # feature vectors: one row of F values
        x = x[:, None, None, :]
    elif x.ndim == 3:  # grayscale images
        x = x[:, None]
    return x


def _natural_ids(client: np.ndarray, client_test: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The file's client ids renumbered 0..K-1 in sorted order (test ids map to the same numbers)."""
    ids, train = np.unique(client, return_inverse=True)
    test = None
    if client_test is not None:
        test = torch.from_numpy(np.searchsorted(ids, client_test).astype(np.int64))
    return torch.from_numpy(train.astype(np.int64)), test


def load_npz(cfg: DataConfig) -> RawDataset:
    """The RawDataset of the .npz file at `cfg.path`; DataError (one line) when the file is unusable."""
    if not cfg.path:
        raise DataError("data.path: dataset npz needs data.path, the .npz file to read")
    path = Path(cfg.path).expanduser()
    where = f"data.path: {path}"
    arrays = _read(path)
    for name in ("x", "y"):
        if name not in arrays:
            raise DataError(f"{where}: has no array {name!r} (has: {', '.join(sorted(arrays)) or 'none'}); "
                            f"expected {_LAYOUT}")
    x = _samples(where, "x", arrays["x"])
    n = len(x)
    _check_integers(where, "y", arrays["y"], n, "label")
    has_test = "x_test" in arrays or "y_test" in arrays
    if has_test and not ("x_test" in arrays and "y_test" in arrays):
        missing = "y_test" if "x_test" in arrays else "x_test"
        raise DataError(f"{where}: has no array {missing!r}; x_test and y_test come together")
    if "client_test" in arrays and not has_test:
        raise DataError(f"{where}: has client_test but no x_test / y_test")
    if "client_test" in arrays and "client" not in arrays:
        raise DataError(f"{where}: has client_test but no client; the test clients are named by the train ids")
    if has_test:
        test_x = _samples(where, "x_test", arrays["x_test"])
        if test_x.shape[1:] != x.shape[1:]:
            raise DataError(f"{where}: x_test has samples of shape {tuple(arrays['x_test'].shape[1:])} but x has "
                            f"{tuple(arrays['x'].shape[1:])}; they must agree")
        _check_integers(where, "y_test", arrays["y_test"], len(test_x), "label")
        test_y = torch.from_numpy(arrays["y_test"].astype(np.int64))
    else:  # no test split: global test metrics are not reported
        test_x, test_y = x[:0], torch.zeros(0, dtype=torch.int64)
    train_client = test_client = None
    if "client" in arrays:
        _check_integers(where, "client", arrays["client"], n, "client id")
        client_test = arrays.get("client_test")
        if client_test is not None:
            _check_integers(where, "client_test", client_test, len(test_x), "client id")
            unknown = np.setdiff1d(client_test, arrays["client"])
            if len(unknown):
                raise DataError(f"{where}: client_test names client {unknown[0]}, which has no sample in client")
        train_client, test_client = _natural_ids(arrays["client"], client_test)
    y = torch.from_numpy(arrays["y"].astype(np.int64))
    num_classes = int(max(int(y.max()), int(test_y.max()) if len(test_y) else 0)) + 1
    if num_classes > MAX_CLASSES:
        raise DataError(f"{where}: labels go up to {num_classes - 1}; allowed 0..{MAX_CLASSES - 1} (classes are "
                        f"0 .. the largest label, so relabel them 0..C-1)")
    return RawDataset("npz", x, y, test_x, test_y, num_classes, train_client, test_client)

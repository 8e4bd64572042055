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

import math
import stat
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
# the most bytes an archive's arrays may unpack to (and x as float32 may take), checked before reading
MAX_NPZ_BYTES = 4 << 30
_LAYOUT = "x, y [, client] [, x_test, y_test [, client_test]]"


def _read(path: Path) -> dict[str, np.ndarray]:
    """The archive's arrays, each checked from its zip entry and its .npy header (shape, dtype,
    declared sizes) before a byte of it is read (issue 42: a 4 MB file that inflates to 11.7 GB, a
    header declaring 10**12 rows)."""
    where = f"data.path: {path}"
    _check_regular_file(path, where)
    try:
        with zipfile.ZipFile(path) as archive:
            entries = {info.filename: info for info in archive.infolist()}
            found = {name: entries[f"{name}.npy"] for name in ARRAYS if f"{name}.npy" in entries}
            if not found and not entries:
                raise DataError(f"{where}: is an empty .npz archive; expected {_LAYOUT}")
            total = sum(info.file_size for info in found.values())
            if total > MAX_NPZ_BYTES:
                raise DataError(
                    f"{where}: its arrays unpack to {_size(total)}; allowed: at most "
                    f"{_size(MAX_NPZ_BYTES)} (autofl.data.npz.MAX_NPZ_BYTES)"
                )
            return {name: _read_entry(archive, info, f"{where}: array {name}") for name, info in found.items()}
    except zipfile.BadZipFile as err:
        raise DataError(f"{where}: {_not_a_zip(path, err)}") from None
    except (OSError, EOFError, RuntimeError, NotImplementedError) as err:
        raise DataError(
            f"{where}: cannot be read as an .npz archive ({type(err).__name__}: {_one_line(err)})"
        ) from None


def _not_a_zip(path: Path, err: Exception) -> str:
    """What a file that is no zip archive is, by its first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    if head == b"\x93NUMPY":
        return f"is a single .npy array, not an .npz archive with {_LAYOUT}"
    if head[:1] == b"\x80":
        return "is a pickle, not an .npz archive; autofl loads no pickled data"
    return f"is not an .npz archive (a zip of .npy arrays: {_one_line(err)}); expected {_LAYOUT}"


def _check_regular_file(path: Path, where: str) -> None:
    """`path` names a regular file (a link to one is followed), else one line saying what it is."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(f"{where}: no such file (expected an .npz with {_LAYOUT})") from None
    except OSError as err:
        raise DataError(f"{where}: cannot be opened ({err.strerror or _one_line(err)})") from None
    if stat.S_ISDIR(mode):
        raise DataError(f"{where}: is a folder, not an .npz file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise DataError(f"{where}: is {kind}, not a regular file; give the .npz file itself")


def _read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> np.ndarray:
    """One .npy entry: its header read and checked first, then its data (at most what it declares)."""
    with archive.open(info) as entry:
        try:
            version = np.lib.format.read_magic(entry)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(entry)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(entry)
        except (ValueError, TypeError, SyntaxError, EOFError) as err:
            raise DataError(f"{where} is not a valid .npy array (its header: {_one_line(err)})") from None
    if any(d < 0 for d in shape):
        raise DataError(f"{where} is not a valid .npy array (its header declares shape {shape})")
    if dtype.hasobject:
        raise DataError(
            f"{where} holds pickled Python objects (dtype {dtype}), which autofl does not load; "
            f"store numbers (e.g. float32 x, int64 y)"
        )
    count = math.prod(shape)
    declared = count * dtype.itemsize
    if declared > MAX_NPZ_BYTES or count * 4 > MAX_NPZ_BYTES:  # x becomes float32 as well
        raise DataError(
            f"{where} declares shape {shape} of {dtype} ({_size(max(declared, count * 4))}); allowed: "
            f"at most {_size(MAX_NPZ_BYTES)} (autofl.data.npz.MAX_NPZ_BYTES)"
        )
    if declared > info.file_size:
        raise DataError(
            f"{where} declares shape {shape} of {dtype} ({_size(declared)}) but its entry holds "
            f"{_size(info.file_size)}; the file is truncated or corrupt"
        )
    with archive.open(info) as entry:
        try:
            return np.lib.format.read_array(entry, allow_pickle=False)
        except (ValueError, EOFError) as err:
            raise DataError(f"{where} cannot be read ({_one_line(err)})") from None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]


def _check_integers(where: str, name: str, a: np.ndarray, n: int, what: str) -> None:
    if a.ndim != 1 or len(a) != n:
        raise DataError(f"{where}: array {name} has shape {a.shape}; expected ({n},), one {what} per sample")
    if not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"{where}: array {name} has dtype {a.dtype}; expected integers ({what}s)")
    if n and a.min() < 0:
        raise DataError(f"{where}: array {name} holds {a.min()}; {what}s must be >= 0")
    if n and what == "label" and a.max() >= MAX_CLASSES:  # in its own dtype: uint64 >= 2**63 would wrap in int64
        raise DataError(
            f"{where}: array {name} holds label {a.max()}; allowed 0..{MAX_CLASSES - 1} (classes are "
            f"0 .. the largest label, so relabel them 0..C-1)"
        )
    if n and a.max() > np.iinfo(np.int64).max:
        raise DataError(f"{where}: array {name} holds {a.max()}; {what}s must fit in int64")


def _samples(where: str, name: str, a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise DataError(f"{where}: array {name} has dtype {a.dtype}; expected numbers (float or integer)")
    if a.ndim not in (2, 3, 4) or a.shape[0] == 0 or 0 in a.shape[1:]:
        raise DataError(
            f"{where}: array {name} has shape {a.shape}; expected (N, F), (N, H, W) or (N, C, H, W) with N >= 1"
        )
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
            raise DataError(
                f"{where}: has no array {name!r} (has: {', '.join(sorted(arrays)) or 'none'}); expected {_LAYOUT}"
            )
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
            raise DataError(
                f"{where}: x_test has samples of shape {tuple(arrays['x_test'].shape[1:])} but x has "
                f"{tuple(arrays['x'].shape[1:])}; they must agree"
            )
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
        raise DataError(
            f"{where}: labels go up to {num_classes - 1}; allowed 0..{MAX_CLASSES - 1} (classes are "
            f"0 .. the largest label, so relabel them 0..C-1)"
        )
    return RawDataset("npz", x, y, test_x, test_y, num_classes, train_client, test_client)

"""The built-in `npz` dataset: arrays from a file (allow_pickle=False), the natural partition from
its client ids, and one line (exit 2, nothing written) for every kind of bad file."""

import pickle

import numpy as np
import pytest
import torch

from autofl.data.datasets import load_raw_dataset
from autofl.data.federated import build_federated
from autofl.errors import ConfigError, DataError
from autofl.experiment import load_experiment
from conftest import read_metrics


def _arrays(n=120, clients=4, features=12, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (rng.normal(size=(n, features)) + y[:, None]).astype(np.float32)  # learnable: the class shifts x
    client = np.repeat(np.arange(clients) * 7 + 3, n // clients)  # ids need not be 0..K-1
    y_test = rng.integers(0, classes, 30)
    x_test = (rng.normal(size=(30, features)) + y_test[:, None]).astype(np.float32)
    return {"x": x, "y": y, "client": client, "x_test": x_test, "y_test": y_test,
            "client_test": np.repeat(client[::n // clients][:3], 10)}


def _save(tmp_path, name="data.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def test_natural_partition_uses_the_files_client_ids(tmp_path):
    arrays = _arrays()
    path = _save(tmp_path, **arrays)
    exp = load_experiment(None, ["data.dataset=npz", f"data.path={path}", "data.partition.kind=natural"])
    assert exp.data.num_clients == 4  # taken from the file when not given
    assert exp.num_classes == 3 and exp.input_shape == (1, 1, 12)
    raw = load_raw_dataset(exp.data)
    assert torch.equal(raw.train_x[:, 0, 0], torch.from_numpy(arrays["x"]))
    fed = build_federated(raw, exp.data, exp.data_seed())
    ids = np.unique(arrays["client"])
    for k, split in enumerate(fed.clients):
        held = torch.cat([split.train, split.val, split.test]).sort().values.numpy()
        assert held.tolist() == np.flatnonzero(arrays["client"] == ids[k]).tolist()
    assert torch.equal(fed.test_x[:, 0, 0], torch.from_numpy(arrays["x_test"]))


def test_train_and_test_pool_maps_test_clients_to_the_same_ids(tmp_path):
    arrays = _arrays()
    path = _save(tmp_path, **arrays)
    exp = load_experiment(None, ["data.dataset=npz", f"data.path={path}", "data.partition.kind=natural",
                                 "data.pool=train+test"])
    fed = build_federated(load_raw_dataset(exp.data), exp.data, exp.data_seed())
    sizes = [len(c.train) + len(c.val) + len(c.test) for c in fed.clients]
    assert sizes == [30 + 10, 30 + 10, 30 + 10, 30]  # client_test names the first three clients


def test_train_on_an_npz_file_end_to_end(run_cli, tmp_path):
    path = _save(tmp_path, **_arrays(n=400))
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "data.dataset=npz", "--set", f"data.path={path}",
                   "--set", "data.partition.kind=natural", "--set", "fl.rounds=3", "--set", "fl.lr=0.1") == 0
    metrics = read_metrics(out)
    assert len(metrics) == 3 and metrics[-1]["personal_test_acc"] > 0.5  # chance is 1/3


def test_image_shapes_and_other_partitions(tmp_path):
    rng = np.random.default_rng(1)
    path = _save(tmp_path, x=rng.integers(0, 255, (80, 16, 16), dtype=np.uint8), y=np.arange(80) % 4)
    exp = load_experiment(None, ["data.dataset=npz", f"data.path={path}", "data.partition.kind=iid",
                                 "data.num_clients=5", "model.arch=cnn"])
    assert exp.input_shape == (1, 16, 16) and exp.num_classes == 4
    raw = load_raw_dataset(exp.data)
    assert raw.test_x.shape == (0, 1, 16, 16)  # no test split in the file: no global test set
    with pytest.raises(ConfigError, match="data.partition.kind: natural needs a dataset with client ids"):
        load_experiment(None, ["data.dataset=npz", f"data.path={path}", "data.partition.kind=natural"])


@pytest.mark.parametrize("mutate, needle", [
    (lambda a: a.pop("y"), "has no array 'y'"),
    (lambda a: a.update(y=a["y"].astype(np.float32)), "array y has dtype float32; expected integers"),
    (lambda a: a.update(y=a["y"][:-1]), "array y has shape (119,); expected (120,)"),
    (lambda a: a.update(client=a["client"][:5]), "array client has shape (5,)"),
    (lambda a: a.update(x_test=a["x_test"][:, :5]), "x_test has samples of shape (5,) but x has (12,)"),
    (lambda a: a.pop("y_test"), "has no array 'y_test'; x_test and y_test come together"),
    (lambda a: a.update(x=np.array([{"a": 1}] * 120, dtype=object)), "holds pickled Python objects"),
    (lambda a: a.update(x=np.full((120, 12), np.nan)), "array x holds NaN or infinite values"),
    (lambda a: a.update(x=np.array(["a"] * 120)), "array x has dtype <U1; expected numbers"),
    (lambda a: a.update(y=-a["y"] - 1), "labels must be >= 0"),
    (lambda a: a.update(client_test=np.full(30, 999)), "client_test names client 999"),
])
def test_bad_files_are_one_line_exit_2_nothing_written(run_cli, tmp_path, capsys, mutate, needle):
    arrays = _arrays()
    mutate(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)  # object arrays are pickled by savez: the file holds a pickle inside
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "data.dataset=npz", "--set", f"data.path={path}",
                   "--set", "data.partition.kind=natural") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert needle in err and "data.path:" in err, err
    assert not out.exists()


def test_not_an_npz_and_config_mistakes(tmp_path):
    pickled = tmp_path / "data.npz"
    pickled.write_bytes(pickle.dumps({"x": [1, 2]}))
    with pytest.raises(DataError, match="is a pickle, not an .npz archive"):
        load_experiment(None, ["data.dataset=npz", f"data.path={pickled}"])
    single = tmp_path / "one.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(DataError, match="single .npy array"):
        load_experiment(None, ["data.dataset=npz", f"data.path={single}"])
    with pytest.raises(DataError, match="no such file"):
        load_experiment(None, ["data.dataset=npz", f"data.path={tmp_path / 'none.npz'}"])
    with pytest.raises(ConfigError, match="data.path: dataset npz reads a file; set data.path"):
        load_experiment(None, ["data.dataset=npz"])
    with pytest.raises(ConfigError, match="data.path: not used by dataset digits; datasets that read a file: npz"):
        load_experiment(None, [f"data.path={pickled}"])
    good = _save(tmp_path, "good.npz", **_arrays())
    with pytest.raises(ConfigError, match=r"data.num_clients: the natural partition of npz has 4 clients \(got 7\)"):
        load_experiment(None, ["data.dataset=npz", f"data.path={good}", "data.partition.kind=natural",
                               "data.num_clients=7"])
    with pytest.raises(ConfigError, match="data.partition.kind: natural needs a dataset with client ids"):
        load_experiment(None, ["data.partition.kind=natural"])  # digits has no clients of its own


# ---- issue 42: sizes checked from the zip entry and the .npy header before reading; labels by range ----
def _npy_header(shape, dtype="<f4") -> bytes:
    """A version 1.0 .npy header declaring `shape` (the data that follows is up to the caller)."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _zip_with(path, entries: dict[str, bytes]) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def _load(path):
    return load_experiment(None, ["data.dataset=npz", f"data.path={path}"])


def test_a_zip_bomb_is_refused_from_its_entry_sizes_before_reading(tmp_path, monkeypatch):
    import zipfile

    import autofl.data.npz as npz

    monkeypatch.setattr(npz, "MAX_NPZ_BYTES", 64 << 20)  # the 4 GiB limit, scaled down to keep the test fast
    bomb = tmp_path / "bomb.npz"
    rows = (96 << 20) // (4 * 16)  # 96 MiB of zeros: about 100 KB compressed
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w") as entry:
            entry.write(_npy_header((rows, 16)))
            block = bytes(1 << 22)
            for _ in range((rows * 64) // len(block)):
                entry.write(block)
        archive.writestr("y.npy", _npy_header((rows,), "<i8"))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(DataError, match=r"data.path: .*bomb.npz: its arrays unpack to 96 MiB; allowed: at most 64 MiB"):
        _load(bomb)


def test_a_huge_declared_shape_is_refused_before_allocating(tmp_path):
    path = tmp_path / "huge.npz"
    _zip_with(path, {"x.npy": _npy_header((10**12, 20)), "y.npy": _npy_header((10**12,), "<i8")})
    with pytest.raises(DataError) as info:
        _load(path)
    text = str(info.value)
    assert "array x declares shape (1000000000000, 20) of float32 (7.45e+04 GiB); allowed: at most 4 GiB" in text, text


def test_a_short_entry_is_corrupt_not_a_read_past_its_end(tmp_path):
    path = tmp_path / "short.npz"
    _zip_with(path, {"x.npy": _npy_header((1000, 20)) + bytes(80), "y.npy": _npy_header((0,), "<i8")})
    with pytest.raises(DataError, match=r"array x declares shape \(1000, 20\) of float32 \(78.1 KiB\) but its entry "
                                        r"holds .*; the file is truncated or corrupt"):
        _load(path)


def test_uint64_labels_past_int64_are_refused_not_wrapped(tmp_path):
    arrays = _arrays()
    arrays["y"] = arrays["y"].astype(np.uint64)
    arrays["y"][3] = 2**63 + 5
    path = tmp_path / "u64.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=r"array y holds label 9223372036854775813; allowed 0..99999"):
        _load(path)


def test_a_bad_header_says_the_header_not_pickles(tmp_path):
    path = tmp_path / "header.npz"
    good = _npy_header((3,), "<i8")
    broken = good.replace(b"'descr': '<i8'", b"'descr': 'zz9'")
    _zip_with(path, {"x.npy": broken + bytes(24), "y.npy": good + bytes(24)})
    with pytest.raises(DataError) as info:
        _load(path)
    text = str(info.value)
    assert "array x is not a valid .npy array (its header:" in text and "pickle" not in text, text


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_special_files_say_what_they_are(tmp_path, kind):
    import os

    path = tmp_path / "data.npz"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        try:
            os.mknod(path, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null's node
        except PermissionError:
            pytest.skip("mknod needs root")
    with pytest.raises(DataError) as info:
        _load(path)
    text = str(info.value)
    expected = {"folder": "is a folder, not an .npz file", "fifo": "is a FIFO, not a regular file",
                "device": "is a device, not a regular file"}[kind]
    assert expected in text and "no such file" not in text, text


def test_a_relative_data_path_is_made_absolute_where_the_config_is_read(tmp_path, monkeypatch):
    from autofl.tuning.strategy.space import parse_space

    np.savez(tmp_path / "rel.npz", **_arrays())
    monkeypatch.chdir(tmp_path)
    exp = _load("rel.npz")
    assert exp.data.path == str(tmp_path / "rel.npz")
    space = parse_space({"study": "rel", "base": {"data": {"dataset": "npz", "path": "rel.npz"}, "fl": {"rounds": 2}},
                         "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}}, "space")
    assert space.base["data"]["path"] == str(tmp_path / "rel.npz")  # what the trials' workers are given
    monkeypatch.chdir("/")  # a worker's folder: the trial's config still names the file
    from autofl.experiment import build_experiment

    assert build_experiment(space.config({"fl.lr": 0.05})).data.path == str(tmp_path / "rel.npz")


def test_a_relative_data_root_is_made_absolute_where_the_config_is_read(tmp_path, monkeypatch):
    """Issue 42: as data.path, a relative data.root names the same folder in a trial's worker."""
    from autofl.experiment import build_experiment
    from autofl.tuning.strategy.space import parse_space

    monkeypatch.chdir(tmp_path)
    assert build_experiment({"data": {"root": "datasets"}}).data.root == str(tmp_path / "datasets")
    space = parse_space({"study": "rel", "base": {"data": {"root": "datasets"}, "fl": {"rounds": 2}},
                         "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}}, "space")
    monkeypatch.chdir("/")  # a worker's folder
    assert build_experiment(space.config({"fl.lr": 0.05})).data.root == str(tmp_path / "datasets")

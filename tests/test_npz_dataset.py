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

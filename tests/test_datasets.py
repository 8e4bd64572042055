"""The embedded digits loader reads scikit-learn's bundled file without importing scikit-learn."""

import numpy as np
import torch

from autofl.config import DataConfig
from autofl.data.datasets import load_raw_dataset


def test_digits_equals_scikit_learn_load_digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    raw = load_raw_dataset(DataConfig(dataset="digits"))
    x = torch.cat([raw.train_x, raw.test_x])
    y = torch.cat([raw.train_y, raw.test_y])
    assert len(y) == len(bunch.target) == 1797
    expected = (torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0 - 0.3) / 0.4
    # the split is a fixed permutation: match every sample of ours to sklearn's by content
    ours = {(tuple(xi.flatten().tolist()), int(yi)) for xi, yi in zip(x, y)}
    theirs = {(tuple(xi.flatten().tolist()), int(yi)) for xi, yi in zip(expected, torch.tensor(bunch.target))}
    assert ours == theirs
    assert np.bincount(y.numpy()).tolist() == np.bincount(bunch.target).tolist()


def _mnist_space(tmp_path, root, download=False):
    import yaml

    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"study": "m", "base": {"data": {"dataset": "mnist", "root": str(root),
                                                                     "download": download}, "fl": {"rounds": 1}},
                                    "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}}))
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_missing_dataset_fails_before_a_study_is_made(run_cli, tmp_path, capsys):
    home = tmp_path / "home"
    assert run_cli("search", "--space", _mnist_space(tmp_path, tmp_path / "empty"), "--dir", home) == 2
    err = _one_error_line(capsys)
    assert "data.dataset: mnist not found under" in err and "MNIST/raw" in err
    assert not (home / "m").exists()  # nothing half-made: the same command works once the data is there


def test_cifar_message_names_its_real_folder(run_cli, tmp_path, capsys):
    assert run_cli("train", "--out", tmp_path / "o", "--set", "data.dataset=cifar10", "--set",
                   f"data.root={tmp_path / 'none'}") == 2
    assert "cifar-10-batches-py" in _one_error_line(capsys)


def test_corrupt_dataset_files_are_one_line(run_cli, tmp_path, capsys):
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (raw / name).write_bytes(b"\x00\x00\x08\x03not an idx file")
    assert run_cli("train", "--out", tmp_path / "o", "--set", "data.dataset=mnist", "--set",
                   f"data.root={tmp_path / 'data'}") == 2
    err = _one_error_line(capsys)
    assert err.startswith("autofl: error: data.dataset: the mnist files under") and "are corrupt" in err


def test_download_without_network_is_one_line(run_cli, tmp_path, capsys, monkeypatch):
    from torchvision import datasets

    monkeypatch.setattr(datasets.MNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens: as offline
    assert run_cli("train", "--out", tmp_path / "o", "--set", "data.dataset=mnist", "--set",
                   f"data.root={tmp_path / 'dl'}", "--set", "data.download=true") == 2
    err = _one_error_line(capsys)
    assert "could not download mnist" in err and not (tmp_path / "o").exists()

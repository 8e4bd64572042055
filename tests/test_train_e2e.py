import pytest
import torch
import yaml

from autofl.experiment import load_experiment
from conftest import read_metrics

METRIC_KEYS = {"round", "personal_val_acc", "personal_val_acc_std", "personal_val_acc_p10", "personal_test_acc", "personal_test_acc_std", "personal_test_acc_p10",
               "personal_val_acc_unweighted", "personal_test_acc_unweighted",
               "global_val_acc", "global_test_acc", "train_loss", "upload_bytes", "download_bytes",
               "upload_bytes_per_round", "download_bytes_per_round", "train_flops", "flops_per_round",
               "personal_val_acc_last3", "personal_val_acc_p10_last3", "global_val_acc_last3"}


def test_train_on_digits_learns_and_writes_outputs(run_cli, tmp_path):
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "fl.rounds=6") == 0
    metrics = read_metrics(out)
    assert [m["round"] for m in metrics] == list(range(1, 7))
    assert set(metrics[-1]) == METRIC_KEYS
    assert metrics[-1]["personal_test_acc"] > 0.5  # chance is 0.1
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    assert (out / "final_state.pt").is_file()
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert load_experiment(out / "config.yaml").model_dump() == load_experiment(None, ["fl.rounds=6"]).model_dump()
    assert resolved["fl"]["rounds"] == 6


def test_final_state_loads_with_weights_only_and_no_autofl_classes(run_cli, tmp_path):
    """FedFCD keeps per-class feature statistics (ClassStats dataclasses); the saved state holds them
    as plain dicts, so torch's safe loader reads the file without allow-listing autofl."""
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "fl.rounds=2", "--set", "method.name=fedfcd") == 0
    state = torch.load(out / "final_state.pt", map_location="cpu", weights_only=True)
    assert state["round"] == 2 and set(state["global_state"]) and state["client_states"]

    def has_stats(tree) -> bool:
        if isinstance(tree, dict):
            return {"counts", "means"} <= set(tree) or any(has_stats(v) for v in tree.values())
        return isinstance(tree, (list, tuple)) and any(has_stats(v) for v in tree)

    assert has_stats(state["method_state"]) or has_stats(state["client_states"])  # the stats were kept


def test_an_empty_split_reports_no_accuracy_instead_of_zero(run_cli, tmp_path, capsys):
    """data.split.val: 0 (the FedFCD protocol): no validation accuracy is made up as 0.0."""
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "fl.rounds=2", "--set", "data.split.train=0.75",
                   "--set", "data.split.val=0", "--set", "data.split.test=0.25") == 0
    last = read_metrics(out)[-1]
    assert not any("val" in key for key in last)  # personal_val_acc*, global_val_acc
    assert {"personal_test_acc", "personal_test_acc_std", "personal_test_acc_p10", "global_test_acc"} <= set(last)
    assert last["personal_test_acc"] > 0.3
    assert "personal_val_acc=-" in capsys.readouterr().out


def test_eval_every_reports_only_evaluated_rounds(run_cli, tmp_path):
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "fl.rounds=5", "--set", "fl.eval_every=2") == 0
    assert [m["round"] for m in read_metrics(out)] == [2, 4, 5]


def test_same_seed_gives_identical_metrics(run_cli, tmp_path):
    args = ["--set", "fl.rounds=3", "--set", "fl.participation=0.5", "--set", "method.name=moon"]
    assert run_cli("train", "--out", tmp_path / "a", *args) == 0
    assert run_cli("train", "--out", tmp_path / "b", *args) == 0
    assert run_cli("train", "--out", tmp_path / "c", *args, "--set", "seed=1") == 0
    a, b, c = ((tmp_path / d / "metrics.jsonl").read_text() for d in "abc")
    assert a == b
    assert a != c


def test_existing_run_is_not_overwritten(run_cli, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert run_cli("train", "--out", out, "--set", "fl.rounds=1") == 2
    assert (out / "keep.txt").read_text() == "precious"


def test_missing_dataset_says_where_it_looked(run_cli, tmp_path, capsys):
    assert run_cli("train", "--out", tmp_path / "r", "--set", "data.dataset=mnist", "--set", f"data.root={tmp_path}") == 2
    err = capsys.readouterr().err
    assert "mnist not found under" in err and "data.download=true" in err
    assert not (tmp_path / "r").exists()


def test_real_fmnist_from_data_root(run_cli, tmp_path, data_root):
    out = tmp_path / "fm"
    code = run_cli("train", "--out", out, "--set", "data.dataset=fmnist", "--set", "data.num_clients=20",
                   "--set", "fl.rounds=2", "--set", "fl.participation=0.25", "--set", "data.split.train=0.1",
                   "--set", "data.split.val=0.1", "--set", "data.split.test=0.8")
    assert code == 0
    metrics = read_metrics(out)
    assert metrics[-1]["personal_test_acc"] > 0.5
    assert metrics[-1]["global_test_acc"] > 0.5  # the official 10,000-image test set


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_overwrite_killed_midway_leaves_the_earlier_run_whole(run_cli, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "fl.rounds=2") == 0
    earlier = _files(out)
    proc = subprocess.Popen([sys.executable, "-m", "autofl.cli", "train", "--out", str(out), "--overwrite",
                             "--set", "fl.rounds=400", "--set", "seed=5"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    new = []
    while time.time() < deadline and not any((p / "metrics.jsonl").exists() and (p / "metrics.jsonl").stat().st_size
                                             for p in new):
        new = [p for p in tmp_path.iterdir() if p.name.startswith(".run.new-")]
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _files(out) == earlier  # no mix of the earlier run's and the new run's files

    assert run_cli("train", "--out", out, "--overwrite", "--set", "fl.rounds=3") == 0
    assert [m["round"] for m in read_metrics(out)] == [1, 2, 3] and set(_files(out)) == set(earlier)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # the killed run's .new-PID too


def test_overwrite_refuses_a_folder_that_is_not_a_run(run_cli, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert run_cli("train", "--out", out, "--overwrite", "--set", "fl.rounds=1") == 2
    assert "also holds notes.txt" in capsys.readouterr().err and (out / "notes.txt").read_text() == "keep me"


# ---- issue 42: a write that fails (a full disk) is one line naming the file, and leaves no temp file ----
@pytest.fixture
def full_disk(tmp_path):
    """A 24 KiB tmpfs (room for config.yaml and metrics.jsonl, not final_state.pt) mounted for the test (root only), unmounted at its end."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.decode().strip()[:80]})")
    yield mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:  # a file still open there
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_at_the_final_state_is_one_line_and_leaves_nothing(run_cli, full_disk, capsys):
    out = full_disk / "run"
    code = run_cli("train", "--out", out, "--set", "fl.rounds=1", "--set", "data.num_clients=2")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (code, err)
    assert f"{out / 'final_state.pt'}: cannot be written: the disk is full" in err, err
    assert list(full_disk.iterdir()) == []  # no run folder, no final_state.pt.tmp


def test_a_failed_config_write_names_the_file_and_leaves_no_temp_file(run_cli, tmp_path, capsys, monkeypatch):
    import errno
    import os

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    out = tmp_path / "run"
    code = run_cli("train", "--out", out, "--set", "fl.rounds=1", "--set", "data.num_clients=2")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert f"{out / 'config.yaml'}: cannot be written: the disk is full" in err and "send it to" not in err, err
    assert not out.exists()


def test_the_shared_writer_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    import errno
    import os

    from autofl.errors import OutputError
    from autofl.files import write_atomic

    path = tmp_path / "best.yaml"
    path.write_text("old: 1\n")

    def read_only(fd):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "fsync", read_only)
    with pytest.raises(OutputError, match="best.yaml: cannot be written: the file system is read-only"):
        write_atomic(path, "new: 2\n")
    assert path.read_text() == "old: 1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]


# ---- issue 42: a split part that gives no client a sample is one line before any work ----
def test_a_validation_split_no_client_gets_is_one_line_and_writes_nothing(run_cli, tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli("train", "--out", out, "--set", "data.split.train=0.799", "--set", "data.split.val=0.001",
                   "--set", "data.split.test=0.2")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert "data.split.val: 0.001 gives no client a validation sample" in err and "allowed: at least" in err, err
    assert not out.exists()


def test_a_search_with_such_a_split_makes_no_study(run_cli, tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"study": "nosplit", "trials": 2, "base": {
        "fl": {"rounds": 2}, "data": {"split": {"train": 0.799, "val": 0.001, "test": 0.2}}},
        "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}}))
    code = run_cli("search", "--space", space, "--dir", tmp_path / "home")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "data.split.val: 0.001 gives no client" in err, (code, err)
    assert not (tmp_path / "home" / "nosplit").exists()

"""Optuna's JournalStorage on a file (`journal:///PATH.log`, `journal://NAME.log` in the study folder):
the URL's rules, its binding to the study folder (a copied folder takes its journal along), and a
missing folder as one line before anything is made. Studies on it end to end: test_search_e2e
(killed driver, two drivers), test_reeval, test_report, test_ledger, test_storage_race, test_slurm."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import optuna
import pytest
import yaml

from autofl.tuning.store.storage import bind_to_folder, check_storage_url, open_storage
from autofl.tuning.store.study import StudyFolder
from conftest import new_ledger


@pytest.mark.parametrize("url,problem", [
    ("journal:", "names no journal file"),
    ("journal:///", "names no journal file"),
    ("journal://logs/optuna.log", "is a relative path with folders"),
    ("journal://../optuna.log", "is a relative path with folders"),
])
def test_a_bad_journal_url_is_one_line(url, problem):
    with pytest.raises(ValueError, match=problem):
        check_storage_url(url, "storage")


def test_a_relative_journal_lies_in_the_study_folder_and_moves_with_it(tmp_path):
    assert bind_to_folder("journal://optuna.log", tmp_path / "s") == f"journal://{tmp_path / 's' / 'optuna.log'}"
    assert bind_to_folder("journal:///abs/x.log", tmp_path) == "journal:///abs/x.log"
    ledger = new_ledger(tmp_path, "journal")
    number, _ = ledger.ask("run-1", "t1", set(), 5, optuna.samplers.RandomSampler(seed=0),
                           lambda trial: trial.suggest_float("x", 0.0, 1.0))
    copy = tmp_path / "copied"
    shutil.copytree(ledger.root, copy)  # taking a study over by copying its folder (README)
    study = StudyFolder(copy)
    assert study.storage_url() == f"journal://{copy / 'optuna.log'}" and study.optuna_name() == "s"
    assert [t.number for t in study.load_optuna().get_trials()] == [number]


def test_a_journal_whose_folder_is_missing_is_one_line_and_makes_nothing(tmp_path):
    from autofl.errors import StorageError

    with pytest.raises(StorageError, match="folder /no/such/folder does not exist"):
        open_storage("journal:///no/such/folder/optuna.log")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"study": "j", "base": {"fl": {"rounds": 1}}, "trials": 1}))
    home = tmp_path / "home"
    env = {**os.environ, "AUTOFL_STORAGE": "journal:///no/such/folder/optuna.log"}
    proc = subprocess.run([sys.executable, "-m", "autofl.cli", "search", "--space", str(space), "--dir", str(home)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "folder /no/such/folder does not exist" in proc.stderr and not (home / "j").exists()

"""Issue 42 (the third hostile sweep): the studies folder, error paths under `params:` and the
scheduler's grace period. Each case is one line and exit code 2 (or works), nothing written."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.test_hostile_input import assert_one_line, cli, files_under, study_with_trials


@pytest.mark.parametrize("bad", ["qs1 backup", "a..b"])
def test_studies_lists_the_valid_studies_and_names_a_folder_with_a_bad_name(tmp_path, capsys, bad):
    root = study_with_trials(tmp_path, "qs1", ["a", "b"])
    shutil.copytree(root, root.parent / bad)  # cp -r qs1 "qs1 backup"
    capsys.readouterr()  # Optuna's line from making the study
    code, out, err = cli(capsys, "studies", "--dir", tmp_path / "home")
    assert code == 0, err
    rows = [line.split()[1] for line in out.splitlines() if line.startswith("│")]
    assert rows == ["qs1"], out
    assert len(err.splitlines()) == 1 and repr(bad) in err and "not a study name" in err, err
    import autofl

    assert autofl.list_studies(tmp_path / "home") == ["qs1"]


@pytest.mark.parametrize("how", ["env", "dir"])
def test_a_studies_folder_that_is_a_file_is_one_line_naming_it(tmp_path, capsys, monkeypatch, how):
    afile = tmp_path / "afile"
    afile.write_text("x")
    if how == "env":
        monkeypatch.setenv("AUTOFL_HOME", str(afile))
        args: tuple = ()
    else:
        monkeypatch.delenv("AUTOFL_HOME", raising=False)
        args = ("--dir", afile)
    before = files_under(tmp_path)
    for command in (("studies",), ("status", "x"), ("best-config", "export", "x")):
        code, out, err = cli(capsys, *command, *args)
        assert_one_line(code, err, f"{'AUTOFL_HOME' if how == 'env' else '--dir'} {afile}: is not a folder")
    assert files_under(tmp_path) == before

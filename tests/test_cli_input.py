"""Hostile input to the CLI: one line, exit 2, before any work, nothing written outside --dir."""

import os
from pathlib import Path

import pytest
import yaml

from autofl.cli import main


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


@pytest.mark.parametrize("name", ["../../etc", "/tmp/abs", "a/b", "..", ".hidden", "x" * 101, "a..b"])
def test_a_study_name_cannot_leave_the_studies_folder(tmp_path, capsys, name):
    home = tmp_path / "deep" / "home"
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"study": "fine", "trials": 1}))
    before = files_under(tmp_path)
    for args in (["search", "--space", space, "--name", name], ["search", "--resume", name], ["search", "--join", name],
                 ["status", name], ["best-config", "export", name]):
        code = main([*map(str, args), "--dir", str(home)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "is not a study name" in err, (args, err)
    assert files_under(tmp_path) == before  # nothing made, inside or outside --dir


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a folder to another uid")
def test_resume_refuses_a_study_folder_another_user_owns(tmp_path, capsys):
    from autofl.tune.space import load_space
    from autofl.tune.study import create_study

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"study": "theirs", "trials": 1}))
    study = create_study(tmp_path / "home", space, load_space(space), None)
    os.chown(study.root, 12345, 12345)
    code = main(["search", "--resume", "theirs", "--dir", str(tmp_path / "home")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "belongs to uid 12345" in err, err

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
    from autofl.tuning.strategy.space import load_space
    from autofl.tuning.store.study import create_study

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"study": "theirs", "trials": 1}))
    study = create_study(tmp_path / "home", space, load_space(space), None)
    os.chown(study.root, 12345, 12345)
    code = main(["search", "--resume", "theirs", "--dir", str(tmp_path / "home")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "belongs to uid 12345" in err, err


def test_every_listed_bad_input_is_one_line_and_exit_2_touching_nothing(tmp_path, capsys):
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "inf.yaml").write_text("study: a\nparams:\n  fl.lr: {type: float, low: 0.01, high: .inf}\n")
    (tmp_path / "edge.yaml").write_text("study: b\nparams:\n  fl.momentum: {type: float, low: 0.5, high: 1.0}\n")
    (tmp_path / "fine.yaml").write_text("study: c\ntrials: 1\n")
    home = str(tmp_path / "home")
    cases = {
        ("train", "--config", str(tmp_path / "binary.yaml")): "not a text file",
        ("search", "--space", str(tmp_path / "binary.yaml"), "--dir", home): "not a text file",
        ("train", "--out", str(tmp_path / "afile")): "is a file",
        ("train", "--out", str(tmp_path / "afile" / "run")): "is a file, so no folder",
        ("train", "--set", "fl.lr=inf", "--out", str(tmp_path / "r1")): "fl.lr: Input should be a finite number",
        ("train", "--set", "fl.rounds=1000000000000", "--out", str(tmp_path / "r2")): "less than or equal to 100000",
        ("search", "--space", str(tmp_path / "fine.yaml"), "--trials", "0", "--dir", home): "allowed: 1 or more",
        ("search", "--space", str(tmp_path / "fine.yaml"), "--trials", "-3", "--dir", home): "allowed: 1 or more",
        ("search", "--space", str(tmp_path / "inf.yaml"), "--dir", home): "params.fl.lr.high",
        ("search", "--space", str(tmp_path / "edge.yaml"), "--dir", home): "params.fl.momentum: high=1.0 is invalid",
        ("best-config", "export", "c", "-o", str(tmp_path / "adir"), "--overwrite", "--dir", home): "is a folder",
        ("best-config", "export", "c", "-o", str(tmp_path / "missing" / "dir" / "x.yaml"), "--dir", home):
            "does not exist",
    }
    before = files_under(tmp_path)
    for args, expected in cases.items():
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and expected in err, (args, err)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("args,named", [
    (["reeval", "any", "--seeds", "10000"], "seeds"), (["reeval", "any", "--seeds", "101"], "seeds"),
    (["reeval", "any", "--top", "1000"], "configs"), (["best-config", "export", "any", "--reeval", "10000"], "seeds"),
    (["best-config", "export", "any", "--reeval", "3", "--top", "21"], "configs"),
    (["best-config", "export", "any", "--reeval", "1"], "0 (no re-evaluation), or 2 or more"),
])
def test_a_reevaluation_is_bounded_before_it_plans(tmp_path, capsys, args, named):
    """Issue 42: --seeds 10000 planned 40,000 runs; the ranges are stated in one line."""
    with pytest.raises(SystemExit) as exit_:  # argparse's own error: usage line and the error line
        main([*args, "--dir", str(tmp_path / "home")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and named in err.splitlines()[-1] and "at most" in err.splitlines()[-1], err
    assert not (tmp_path / "home").exists()


def test_the_api_bounds_a_reevaluation_too(tmp_path):
    from autofl.errors import AutoFLError
    from autofl.limits import MAX_SEEDS, MAX_TOP, check_reeval_size

    check_reeval_size(MAX_SEEDS, MAX_TOP)
    for seeds, top, named in ((MAX_SEEDS + 1, 1, "seeds"), (1, 1, "seeds"), (2, MAX_TOP + 1, "top"), (2, 0, "top")):
        with pytest.raises(AutoFLError, match=f"^{named}: .*allowed"):
            check_reeval_size(seeds, top)

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


FLOAT = {"type": "float", "low": 0.1, "high": 0.5}


@pytest.mark.parametrize("space, path", [
    ({"params": {"method.mu": FLOAT, "fl.learning_rate": FLOAT}, "base": {"method": {"name": "fedprox"}}},
     "params.fl.learning_rate: fl.learning_rate: unknown key"),
    ({"params": {"fl.lr": FLOAT, "fl.momentum": FLOAT, "model.widht": {"type": "int", "low": 2, "high": 4}}},
     "params.model.widht: model.widht: unknown key"),
    ({"params": {"method.name": {"type": "categorical", "choices": ["fedavg", "fedprox"]}, "fl.lr": FLOAT,
                 "fl.learning_rate": FLOAT}}, "params.fl.learning_rate: fl.learning_rate: unknown key"),
    ({"params": {"method.name": {"type": "categorical", "choices": ["fedavg", "fedprox"]}, "fl.lr": FLOAT},
      "conditional": {"fedprox": {"method.mu": FLOAT, "method.muu": FLOAT}}},
     "conditional.fedprox.method.muu: method.muu: unknown key for method fedprox"),
])
def test_a_bad_param_is_reported_under_its_own_key(tmp_path, capsys, space, path):
    """Issue 42: a bad entry under params: that was not the first was reported under the first's name
    (`params.method.alpha: fl.learning_rate: unknown key`)."""
    file = tmp_path / "space.yaml"
    file.write_text(yaml.safe_dump({"study": "s", "trials": 2, **space}, sort_keys=False))
    code, out, err = cli(capsys, "search", "--space", file, "--dir", tmp_path / "home")
    assert_one_line(code, err, f"space.yaml: {path}")
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("kind", ["asha", "hyperband", "median"])
def test_a_grace_period_beyond_the_rounds_is_one_line(tmp_path, capsys, kind):
    """Issue 42: scheduler.grace_period above the round count silently disabled pruning."""
    file = tmp_path / "space.yaml"
    file.write_text(yaml.safe_dump({"study": "g", "trials": 2, "base": {"fl": {"rounds": 4}},
                                    "scheduler": {"kind": kind, "grace_period": 5}}))
    code, out, err = cli(capsys, "search", "--space", file, "--dir", tmp_path / "home")
    assert_one_line(code, err, "scheduler.grace_period: 5 is more than the 4 rounds")
    assert "allowed: 1..4" in err
    assert not (tmp_path / "home").exists()
    from autofl.tuning.strategy.space import load_space

    file.write_text(yaml.safe_dump({"study": "g", "base": {"fl": {"rounds": 4}},
                                    "scheduler": {"kind": kind, "grace_period": 4}}))
    assert load_space(file).scheduler.grace_period == 4

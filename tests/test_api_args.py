"""The Python API validates its arguments like the CLI (issue 42): one ArgumentError naming the
call, the argument and what it allows, raised before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import autofl
from autofl.errors import ArgumentError, AutoFLError
from tests.test_hostile_input import study_with_trials


def test_the_issues_wrong_arguments_are_one_line_each(tmp_path):
    home = tmp_path / "home"
    space = {"study": "s", "trials": 2}
    cases = [
        (lambda: autofl.train({}, out=123), "train: out=123 is not allowed; allowed: the run's folder, a path"),
        (lambda: autofl.search(space, trials="3", dir=home), "search: trials='3' is not allowed; allowed: a whole "
                                                             "number from 1 to 100000"),
        (lambda: autofl.search(space, trials=1.5, dir=home), "search: trials=1.5 is not allowed"),
        (lambda: autofl.search(space, name=123, dir=home), "search: name=123 is not allowed; allowed: a study name"),
        (lambda: autofl.load_study(123, dir=home), "load_study: name=123 is not allowed"),
    ]
    for call, line in cases:
        with pytest.raises(ArgumentError) as info:
            call()
        assert str(info.value).startswith(line), str(info.value)
        assert isinstance(info.value, AutoFLError) and info.value.exit_code == 2
    assert not home.exists() and list(tmp_path.iterdir()) == []  # no half-made study


def test_a_studys_calls_check_their_arguments(tmp_path):
    study_with_trials(tmp_path, "st", ["a", "b"])
    study = autofl.load_study("st", dir=tmp_path / "home")
    before = sorted(Path(tmp_path).rglob("*"))
    with pytest.raises(ArgumentError, match=r"^reevaluate: seeds=2.5 is not allowed; allowed: a whole number of 2"):
        study.reevaluate(seeds=2.5)
    with pytest.raises(ArgumentError, match=r"^best_config: reeval=\{\} is not allowed; allowed: a re-evaluation "
                                            r"summary"):
        study.best_config(reeval={})
    with pytest.raises(ArgumentError, match=r"^report: out=123 is not allowed"):
        study.report(out=123)
    assert sorted(Path(tmp_path).rglob("*")) == before
    assert study.best_config()["metadata"]["trial"] == 2  # a right call still works

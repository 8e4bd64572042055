"""Search-space files: each error gives its one-line message before Ray starts."""

from pathlib import Path

import pytest
import yaml

from autofl.errors import AutoFLError, ConfigError
from autofl.tuning.strategy.space import initial_point, load_space

SPACES = sorted(Path(__file__).parent.parent.joinpath("search_spaces").glob("*.yaml"))


def write(tmp_path, **changes):
    space = {"study": "t", "base": {"fl": {"rounds": 3}, "method": {"name": "fdcl"}},
             "params": {"method.mu": {"type": "float", "low": 0.05, "high": 2.0}}}
    space.update(changes)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.parametrize("space", SPACES, ids=lambda p: p.stem)
def test_shipped_spaces_validate(space):
    s = load_space(space)
    if s.study != "cross_method":
        point = initial_point(s)
        assert point is not None, "each method space's first trial is the paper default"
        assert set(point) == set(s.params)


@pytest.mark.parametrize("changes,needle", [
    ({"bogus": 1}, "bogus: unknown key; allowed keys: study, base, params"),
    ({"params": {"method.mu": {"type": "float", "low": 2, "high": 1}}}, "params.method.mu: low must be <= high"),
    ({"objective": "personal_test_acc"}, "objective: 'personal_test_acc' is not a validation metric"),
    ({"base": {"method": {"name": "nope"}}}, "base.method.name: unknown method 'nope'"),
    ({"params": {"fl.nope": {"type": "float", "low": 0.1, "high": 1}}}, "params.fl.nope: fl.nope: unknown key"),
    ({"params": {"method.lam": {"type": "float", "low": 0.1, "high": 1}}}, "params.method.lam: method.lam: unknown key for method fdcl"),
    ({"params": {"method.name": {"type": "categorical", "choices": ["fdcl", "nope"]}}}, "choice 'nope' is invalid"),
    ({"params": {"method.mu": {"type": "categorical"}}}, "categorical needs a non-empty 'choices' list"),
])
def test_space_errors_are_one_line(tmp_path, changes, needle):
    with pytest.raises(ConfigError) as info:
        load_space(write(tmp_path, **changes))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("objective", ["personal_val_acc", "personal_val_acc_p10", "personal_val_acc_std"])
def test_a_validation_objective_needs_a_validation_split(tmp_path, objective):
    path = write(tmp_path, base={"data": {"split": {"train": 0.75, "val": 0.0, "test": 0.25}}}, params={},
                 objective=objective)
    with pytest.raises(ConfigError, match=f"objective: {objective} needs validation samples, but data.split.val "
                                          f"can be 0; allowed: data.split.val > 0"):
        load_space(path)


def test_fairness_objectives_are_allowed(tmp_path):
    assert load_space(write(tmp_path, base={}, params={}, objective="personal_val_acc_p10")).objective == \
        "personal_val_acc_p10"
    with pytest.raises(ConfigError, match="objective: 'personal_test_acc' is not a validation metric"):
        load_space(write(tmp_path, base={}, params={}, objective="personal_test_acc"))


def test_global_objective_needs_a_global_model(tmp_path):
    path = write(tmp_path, base={"method": {"name": "fedfcd"}}, params={}, objective="global_val_acc")
    with pytest.raises(ConfigError, match="method fedfcd has no global model"):
        load_space(path)


def test_a_global_objective_or_constraint_needs_the_global_metrics_computed(tmp_path):
    base = {"eval": {"global_metrics": False}}
    with pytest.raises(ConfigError, match="objective: global_val_acc is not computed with base.eval.global_metrics "
                                          "false; allowed: personal_val_acc, "):
        load_space(write(tmp_path, base=base, params={}, objective="global_val_acc"))
    with pytest.raises(ConfigError, match="constraints: global_val_acc is not computed"):
        load_space(write(tmp_path, base={**base, "method": {"name": "fedavg"}}, params={},
                         constraints=["global_val_acc >= 0.5"], sampler={"kind": "tpe"}))
    assert load_space(write(tmp_path, base=base, params={})).base_experiment().eval.global_metrics is False


def test_a_smoothed_accuracy_is_an_objective_in_the_max_direction(tmp_path):
    space = load_space(write(tmp_path, objective="personal_val_acc_last3"))
    assert space.objective == "personal_val_acc_last3" and space.mode == "max"
    with pytest.raises(ConfigError, match="method fedfcd has no global model, so global_val_acc_last3 is undefined"):
        load_space(write(tmp_path, base={"method": {"name": "fedfcd"}}, params={}, objective="global_val_acc_last3"))


def test_cli_bad_space_exits_2_before_ray_and_writes_nothing(run_cli, tmp_path, capsys):
    path = write(tmp_path, objective="global_test_acc")
    home = tmp_path / "home"
    assert run_cli("search", "--space", path, "--dir", home) == 2
    assert "objective" in capsys.readouterr().err
    assert not home.exists()


def test_resume_unknown_study_lists_existing(run_cli, tmp_path, capsys):
    (tmp_path / "alpha").mkdir()
    (tmp_path / "alpha" / "space.yaml").write_text(yaml.safe_dump({"study": "alpha"}))
    assert run_cli("search", "--resume", "nope", "--dir", tmp_path) == 2
    err = capsys.readouterr().err
    assert "study 'nope' not found" in err and "alpha" in err


def test_existing_study_is_not_overwritten(tmp_path):
    from autofl.tuning.store.study import create_study

    path = write(tmp_path)
    space = load_space(path)
    create_study(tmp_path / "home", path, space, None)
    with pytest.raises(AutoFLError, match="already exists"):
        create_study(tmp_path / "home", path, space, None)


def test_cross_method_space_runs_each_method_with_its_paper_settings_and_enqueues_its_default():
    import optuna

    from autofl.experiment import build_experiment
    from autofl.tuning.strategy.space import DefineByRun, start_points

    space = load_space(Path(__file__).parent.parent / "search_spaces" / "cross_method.yaml")
    eccr = build_experiment(space.config({"method.name": "fedeccr", "fl.lr": 0.02}))
    assert (eccr.fl.local_epochs, eccr.fl.batch_size, eccr.fl.lr, eccr.fl.rounds) == (10, 64, 0.02, 30)
    fcd = build_experiment(space.config({"method.name": "fedfcd"}))
    assert (fcd.fl.batch_size, fcd.fl.momentum, fcd.method.params()["server_lr"]) == (10, 0.0, 0.01)
    points = start_points(space)
    assert [p["method.name"] for p in points] == ["fdcl", "fedeccr", "dualfed", "fedsiam_da", "fedfcd"]
    assert points[0] == {"method.name": "fdcl", "fl.lr": 0.01, "fdcl:method.mu": 0.1, "fdcl:method.tau": 0.5}
    assert points[3]["fl.lr"] == 0.1  # fedsiam_da's own paper lr

    # what OptunaSearch does with points_to_evaluate: enqueue them, then ask through the define-by-run space
    study = optuna.create_study(direction="maximize")
    for p in points:
        study.enqueue_trial(p)
    asked = []
    for _ in points:
        trial = study.ask()
        DefineByRun(space)(trial)
        asked.append(trial.params)
    assert asked == points


@pytest.mark.parametrize("overlay,needle", [
    ({"fedavg": {"fl": {"lr": 0.1}}}, "method_base.fedavg: not a method this study runs; allowed: fdcl, fedfcd"),
    ({"fdcl": {"fl": {"rounds": 5}}}, "method_base.fdcl.fl.rounds: the study's own for every method"),
    ({"fdcl": {"data": {"num_clients": 5}}}, "method_base.fdcl.data: the study's own for every method"),
    ({"fdcl": {"method": {"lam": 1}}}, "method.lam: unknown key for method fdcl"),
])
def test_method_base_errors(tmp_path, overlay, needle):
    path = write(tmp_path, base={"fl": {"rounds": 3}}, method_base=overlay,
                 params={"method.name": {"type": "categorical", "choices": ["fdcl", "fedfcd"]}})
    with pytest.raises(ConfigError) as info:
        load_space(path)
    assert needle in str(info.value) and "\n" not in str(info.value)

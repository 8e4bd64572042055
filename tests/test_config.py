import pytest

from autofl.config import Experiment
from autofl.experiment import load_experiment
from autofl.errors import ConfigError


def test_empty_config_is_valid_default():
    exp = Experiment()
    assert (exp.data.dataset, exp.model.arch, exp.method.name) == ("digits", "mlp", "fedavg")


def test_set_overrides_parse_yaml_scalars():
    exp = load_experiment(None, ["fl.lr=0.2", "data.partition.kind=iid", "method.name=fedprox", "method.mu=0.5"])
    assert exp.fl.lr == 0.2 and exp.data.partition.kind == "iid"
    assert exp.method.params() == {"mu": 0.5}


def test_data_root_falls_back_to_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOFL_DATA_ROOT", str(tmp_path))
    assert Experiment().data.resolved_root() == tmp_path


@pytest.mark.parametrize("overrides,needle", [
    (["data.partition.alpha=0"], "data.partition.alpha: Input should be greater than 0"),
    (["data.split.train=0.5"], "data.split: train + val + test must sum to 1"),
    (["fl.participation=0"], "fl.participation: Input should be greater than 0"),
    (["fl.participation=1.2"], "fl.participation: Input should be less than or equal to 1"),
    (["model.head_layers=3"], "model.head_layers: 3 is more than arch mlp allows; allowed 1..2"),
    (["data.bogus=1"], "data.bogus: unknown key; allowed keys: dataset, root"),
    (["method.name=nope"], "method.name: unknown method 'nope'; allowed: "),
    (["method.mu=1"], "method.mu: unknown key for method fedavg"),
    (["fl.rounds=ten"], "fl.rounds: Input should be a valid integer"),
    (["model.arch=cnn"], "model.arch: cnn needs images of at least 14px"),
    (["model.projector_depth=2"], "model.projector_depth: not used by method fedavg"),
    (["data.partition.kind=pathological", "data.partition.classes_per_client=11"],
     "data.partition.classes_per_client: 11 exceeds"),
])
def test_errors_are_one_line_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as info:
        load_experiment(None, overrides)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_cli_config_error_exits_2_and_writes_nothing(run_cli, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli("train", "--out", out, "--set", "data.partition.alpha=-1") == 2
    assert "data.partition.alpha" in capsys.readouterr().err
    assert not out.exists()


def test_malformed_yaml_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("fl: {rounds: [1,\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(bad)
    assert "is not valid YAML" in str(info.value) and "\n" not in str(info.value)


def test_clients_per_round_is_what_a_round_samples_half_up():
    from autofl.engine.simulation import Simulation
    from autofl.methods.registry import get_method_class
    from autofl.experiment import build_experiment

    for n, p, expected in [(5, 0.5, 3), (20, 0.5, 10), (10, 0.05, 1), (7, 1.0, 7)]:
        exp = build_experiment({"data": {"num_clients": n, "partition": {"kind": "iid"}},
                                "fl": {"participation": p, "rounds": 1}})
        assert exp.clients_per_round() == expected
        assert len(Simulation(exp, get_method_class(exp.method.name)).sample_clients(0)) == expected  # what the progress bar and report count


def test_a_methods_params_are_validated_once_and_carried_typed():
    """Issue 38: a method's params were validated, carried as an untyped dict, and validated again where
    the method was built. Resolving the experiment validates them once; the typed Params travel with the
    experiment (copies and pickles to Ray workers) and are what the simulation hands the method. A value
    written after resolution is validated then, once."""
    import pickle

    from autofl.engine.simulation import Simulation
    from autofl.experiment import load_experiment
    from autofl.registry import METHODS

    params_cls = METHODS.get("fdcl").Params
    exp = load_experiment(overrides=["method.name=fdcl", "data.dataset=digits", "fl.rounds=1"])
    typed = exp.method.typed(params_cls)
    assert isinstance(typed, params_cls) and typed is exp.method.typed(params_cls)  # no second validation
    assert pickle.loads(pickle.dumps(exp)).method.typed(params_cls) == typed
    assert Simulation(exp, METHODS.get("fdcl")).method.params is typed
    assert exp == type(exp).model_validate(exp.model_dump())  # the carried Params are a cache, not a value
    exp.method.mu = 0.7
    assert exp.method.typed(params_cls).mu == 0.7 and exp.method.typed(params_cls) is exp.method.typed(params_cls)

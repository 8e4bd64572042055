"""scripts/reproduce.py: every preset is a valid experiment for each of its methods, and
FedFCD's Table 1 presets follow PFLlib's protocol (the pairs {0,1}, {2,3}, ... of pathological(2))."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent.parent / "scripts"


@pytest.fixture(scope="module")
def reproduce():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import reproduce as module
        yield module
    finally:
        sys.path.remove(str(SCRIPTS))


def test_every_preset_builds_for_each_of_its_methods(reproduce):
    from autofl.experiment import build_experiment

    assert {"fedfcd-t1-fmnist-pat", "fedfcd-t1-fmnist-dir", "fdcl-t1-fmnist", "fedeccr-t1-cifar10",
            "fedsiam-da-cifar10"} <= set(reproduce.PRESETS)
    for name, preset in reproduce.PRESETS.items():
        assert preset.compare in ("best", "final") and (preset.paper or preset.note), name
        assert set(preset.methods) <= {*preset.paper, *preset.extra}, name
        for method in [*preset.paper, *preset.extra]:
            exp = build_experiment(reproduce.method_config(preset, method, rounds=7))
            assert exp.method.name == method and exp.fl.rounds == 7


def test_a_preset_gives_each_method_its_papers_own_settings(reproduce):
    from autofl.experiment import build_experiment

    preset = reproduce.PRESETS["fedsiam-da-cifar10"]
    exp = {m: build_experiment(reproduce.method_config(preset, m)) for m in ("fedsiam_da", "dualfed", "moon")}
    assert (exp["fedsiam_da"].fl.lr, exp["fedsiam_da"].fl.momentum, exp["fedsiam_da"].fl.local_epochs) == (0.1, 0.9, 5)
    assert exp["fedsiam_da"].method.mu == 0.1
    assert (exp["dualfed"].fl.lr, exp["dualfed"].fl.momentum, exp["dualfed"].fl.batch_size) == (0.01, 0.5, 256)
    assert exp["moon"].method.mu == 1.0 and exp["moon"].model.projector_depth == 2
    assert preset.base["fl"]["lr"] == 0.1  # the overlays leave the shared scenario alone
    eccr = reproduce.PRESETS["fedeccr-t1-cifar10"]
    assert eccr.metric == "global_test_acc" and eccr.base["model"]["arch"] == "moon_cnn"
    assert build_experiment(reproduce.method_config(eccr, "fedeccr")).method.calib_momentum == 0.0


def test_fedfcd_pathological_preset_is_pfllibs_protocol(reproduce):
    base = reproduce.PRESETS["fedfcd-t1-fmnist-pat"].base
    assert base["data"]["partition"] == {"kind": "pathological", "classes_per_client": 2, "class_order": "in_order"}
    assert base["data"]["pool"] == "train+test" and base["data"]["split"] == {"train": 0.75, "val": 0.0, "test": 0.25}
    assert base["fl"]["batch_size"] == 10 and base["fl"]["momentum"] == 0.0


def test_the_seed_papers_baselines_have_their_rows_and_their_reference_settings(reproduce):
    """FedFCD Table 1 reports FedProto and FedGH (as PFLlib runs them: FedProto's distance is
    nn.MSELoss), FDCL Table 1 reports Ditto (FLGo's, lambda 1)."""
    from autofl.experiment import build_experiment

    pat, dirichlet = reproduce.PRESETS["fedfcd-t1-fmnist-pat"], reproduce.PRESETS["fedfcd-t1-fmnist-dir"]
    assert (pat.paper["fedproto"], pat.paper["fedgh"]) == (99.16, 99.22)
    assert (dirichlet.paper["fedproto"], dirichlet.paper["fedgh"]) == (96.52, 96.58)
    for preset in (pat, dirichlet):
        proto = build_experiment(reproduce.method_config(preset, "fedproto")).method
        assert (proto.lam, proto.distance) == (1.0, "mse")
        gh = build_experiment(reproduce.method_config(preset, "fedgh")).method
        assert (gh.server_lr, gh.server_epochs) == (0.01, 1)
    fdcl = reproduce.PRESETS["fdcl-t1-fmnist"]
    assert fdcl.paper["ditto"] == 76.19
    ditto = build_experiment(reproduce.method_config(fdcl, "ditto")).method
    assert (ditto.lam, ditto.personal_epochs) == (1.0, None)


def test_list_prints_every_preset(reproduce, capsys):
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in reproduce.PRESETS)


@pytest.mark.parametrize("space,preset", [("fedfcd", "fedfcd-t1-fmnist-pat"), ("fdcl", "fdcl-t1-fmnist"),
                                          ("fedeccr", "fedeccr-t1-cifar10"), ("fedsiam_da", "fedsiam-da-cifar10"),
                                          ("dualfed", "fedsiam-da-cifar10"), ("fedproto", "fedfcd-t1-fmnist-pat"),
                                          ("fedgh", "fedfcd-t1-fmnist-pat"), ("fedrep", "fedfcd-t1-fmnist-pat"),
                                          ("ditto", "fedfcd-t1-fmnist-pat")])
def test_each_method_space_searches_on_its_papers_setting(reproduce, space, preset):
    """The shipped space's base is the reproduce preset's scenario and the method's own settings;
    only the split differs (the search needs validation samples) and the rounds may."""
    from autofl.experiment import build_experiment
    from autofl.tuning.strategy.space import load_space

    base = build_experiment(load_space(SCRIPTS.parent / "search_spaces" / f"{space}.yaml").base)
    paper = build_experiment(reproduce.method_config(reproduce.PRESETS[preset], base.method.name))
    assert base.data.split.val > 0
    assert base.data.model_dump(exclude={"split"}) == paper.data.model_dump(exclude={"split"})
    assert base.model == paper.model and base.method == paper.method
    assert base.fl.model_dump(exclude={"rounds"}) == paper.fl.model_dump(exclude={"rounds"})


def test_a_bad_row_or_setting_is_one_line_and_exit_2_before_any_training(reproduce, capsys):
    assert reproduce.main(["fedfcd-t1-fmnist-pat", "--methods", "fedper", "--set", "method.server_lfrs=latest"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: method.server_lfrs: unknown key for method fedper; allowed keys: (none)"
    assert reproduce.main(["fedfcd-t1-fmnist-pat", "--set", "fl.participation=7"]) == 2
    assert "fl.participation" in capsys.readouterr().err

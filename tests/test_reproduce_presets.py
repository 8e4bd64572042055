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

    assert {"fedfcd-t1-fmnist-pat", "fedfcd-t1-fmnist-dir", "fdcl-t1-fmnist"} <= set(reproduce.PRESETS)
    for name, preset in reproduce.PRESETS.items():
        assert preset.compare in ("best", "final") and preset.paper, name
        for method in [*preset.paper, *preset.extra]:
            build_experiment({**preset.base, "method": {"name": method}})


def test_fedfcd_pathological_preset_is_pfllibs_protocol(reproduce):
    base = reproduce.PRESETS["fedfcd-t1-fmnist-pat"].base
    assert base["data"]["partition"] == {"kind": "pathological", "classes_per_client": 2, "class_order": "in_order"}
    assert base["data"]["pool"] == "train+test" and base["data"]["split"] == {"train": 0.75, "val": 0.0, "test": 0.25}
    assert base["fl"]["batch_size"] == 10 and base["fl"]["momentum"] == 0.0


def test_list_prints_every_preset(reproduce, capsys):
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in reproduce.PRESETS)

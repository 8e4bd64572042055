"""Fuzzing the input paths (hypothesis): random config and space files give a valid run or exit 2
with one line, never a traceback, and leave the files already on disk unchanged."""

from __future__ import annotations

import contextlib
import hashlib
import io
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autofl.cli import main

VALUES = st.one_of(
    st.integers(-3, 6), st.sampled_from([0, -1, 10**12, 2**63]), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.booleans(), st.none(), st.lists(st.integers(0, 3), max_size=3),
)
KNOWN = {
    "data": ["dataset", "num_clients", "partition", "split", "pool"],
    "model": ["arch", "head_layers", "projector_depth", "projector_dim"],
    "fl": ["rounds", "participation", "local_epochs", "batch_size", "lr", "momentum", "weight_decay", "eval_every"],
    "method": ["name", "mu", "tau", "lam"],
    "runtime": ["device", "executor", "dtype", "threads"],
}


@st.composite
def configs(draw) -> dict:
    tree: dict = {}
    for section in draw(st.lists(st.sampled_from([*KNOWN, "junk"]), unique=True, max_size=4)):
        keys = KNOWN.get(section, ["x"]) + ["bogus"]
        tree[section] = {k: draw(VALUES) for k in draw(st.lists(st.sampled_from(keys), unique=True, max_size=3))}
    if draw(st.booleans()):
        tree["seed"] = draw(VALUES)
    return tree


@st.composite
def spaces(draw) -> dict:
    space: dict = {"study": draw(st.sampled_from(["ok", "ok", "ok", "../up", "a b", ""])),
                   "trials": draw(st.one_of(st.integers(1, 5), VALUES))}
    params = {}
    for key in draw(st.lists(st.sampled_from(["fl.lr", "fl.batch_size", "method.mu", "bogus.key"]), unique=True,
                             max_size=2)):
        kind = draw(st.sampled_from(["float", "int", "categorical", "nope"]))
        spec = {"type": kind}
        if kind == "categorical":
            spec["choices"] = draw(st.lists(VALUES, max_size=3))
        else:
            bound = st.one_of(st.floats(0.001, 1.0), st.integers(1, 64), VALUES)
            spec.update(low=draw(bound), high=draw(bound))
            if draw(st.booleans()):
                spec["log"] = draw(VALUES)
        params[key] = spec
    space["params"] = params
    space["base"] = {"method": {"name": draw(st.sampled_from(["fdcl", "fedavg", "nope"]))}}
    return space


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def call(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse
            code = int(exit_.code or 0)
    return code, err.getvalue().strip()


def assert_clean(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("autofl: error: "), err
    assert "Traceback" not in err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=configs(), raw=st.one_of(st.none(), st.binary(max_size=40)))
def test_random_configs_train_or_fail_with_one_line(tree, raw):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = folder / "config.yaml"
        config.write_bytes(raw if raw is not None else yaml.safe_dump(tree).encode())
        earlier = folder / "earlier_run"
        earlier.mkdir()
        (earlier / "metrics.jsonl").write_text('{"round": 1}\n')
        before = hashes(folder)
        # a tiny run when the config is valid: one round of digits, whatever else it says
        small = ["--set", "fl.rounds=1", "--set", "data.dataset=digits", "--set", "data.num_clients=2",
                 "--set", "fl.local_epochs=1", "--set", "runtime.device=cpu"]
        code, err = call(["train", "--config", str(config), *small, "--out", str(earlier)])
        assert_clean(code, err)
        assert code == 2 and hashes(folder) == before  # an earlier run's folder is never written over
        code, err = call(["train", "--config", str(config), *small, "--out", str(folder / "new")])
        assert_clean(code, err)
        event(f"train exit {code}")
        if code == 2:
            assert not (folder / "new").exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=spaces())
def test_random_spaces_are_accepted_or_refused_in_one_line_before_ray(space, monkeypatch_module):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "space.yaml"
        path.write_text(yaml.safe_dump(space))
        (folder / "studies" / "other").mkdir(parents=True)
        (folder / "studies" / "other" / "space.yaml").write_text("study: other\n")
        before = hashes(folder)
        code, err = call(["search", "--space", str(path), "--dir", str(folder / "studies")])
        assert_clean(code, err)
        event(f"search exit {code}")
        if code == 2:
            assert hashes(folder) == before  # a refused space leaves nothing behind


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def monkeypatch_module():
    """A valid space would start Ray: stop at the point where the search would begin."""
    from autofl.tuning.tune import ray_start
    from autofl.tuning.tune import runner

    import optuna

    def one_finished_trial(study, *args, **kwargs):  # a search with no finished trial exits 1 (issue 18)
        ot = optuna.create_study(study_name=study.name, storage=study.storage_url(), load_if_exists=True)
        ot.tell(ot.ask(), 0.5)

    mp = pytest.MonkeyPatch()
    mp.setattr(ray_start, "init_ray", lambda address, **kwargs: None)
    mp.setattr(runner, "run_or_resume", one_finished_trial)
    yield mp
    mp.undo()

"""Fuzzing the CLI with issue 18's hostile classes (hypothesis): space files (alias bombs, markup,
control and bidi characters, huge or self-referencing documents, fractional int steps, resources),
study names, paths, storage URLs (passwords in every form, in-memory and relative SQLite,
unreachable servers), `--storage-path`, `--address` and `--set` values. Whatever is drawn: exit 0
or 2, no traceback, at most 3 lines on failure, nothing written by a failed start, and the
secret in no output and no file. Ray and the trials are replaced by a stand-in that records one
finished trial, so every example takes well under a second."""

from __future__ import annotations

import contextlib
import hashlib
import io
import socket
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from autofl.cli import main
from conftest import start_ray_without_ray

SECRET = "Fz-s3cret-4e1b"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _closed_port()  # nothing listens there
HOSTILE_TEXT = st.sampled_from(["[/x]", "[bold]x", "configs[v2]", "\x1b[31mred", "a\u202eb", "$\\frac{1}{$", "a\rb",
                                ":smile:", "ok", "x" * 120, "é", ""])
NAMES = st.one_of(st.sampled_from(["ok", "a..b", "..", "a/b", ".hidden", "x" * 101, "y" * 300, "-dash", "A_1.b-2"]),
                  HOSTILE_TEXT)
STORAGE = st.sampled_from([
    None, None, f"postgresql+psycopg://autofl@127.0.0.1:{PORT}/db?password={SECRET}",
    f"postgresql+psycopg://autofl@127.0.0.1:{PORT}/db?PASSWORD={SECRET}",
    f"postgresql+psycopg://autofl@127.0.0.1:{PORT}/db?pass%77ord={SECRET}",
    f"postgresql+psycopg://autofl:{SECRET}@127.0.0.1:{PORT}/db", f"postgresql+psycopg:///db?host=h&password={SECRET}",
    f"postgresql+psycopg://autofl@127.0.0.1:{PORT}/db", "sqlite:///:memory:", "sqlite://", "sqlite:///relative.db",
    f"mysql://u:{SECRET}@h/db", "not a url", "[/x]://h/db",
])
ENV_STORAGE = st.sampled_from([None, f"postgresql+psycopg://autofl@127.0.0.1:{PORT}/db?sslmode=prefer&password={SECRET}",
                               f"postgresql+psycopg://autofl:{SECRET}@127.0.0.1:{PORT}/db"])
SET_VALUES = st.sampled_from(["fl.rounds=true", "fl.lr=[/x]", "metadata.x=\x1b[2J", "runtime.threads=100000",
                              "metadata.b=[&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, "
                              "*a], &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, "
                              "*c], [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]]", "fl.rounds=1", "seed=1e20", "=x", "x"])
BOMB = "".join(f"  {a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
               for p, a in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg"))


@st.composite
def space_texts(draw) -> str:
    space: dict = {"study": draw(NAMES), "trials": draw(st.sampled_from([1, 2, 0, 10**20, True, "2"])),
                   "base": {"fl": {"rounds": 1}, "data": {"num_clients": 2}}}
    storage = draw(STORAGE)
    if storage is not None:
        space["storage"] = storage
    if draw(st.booleans()):
        space["storage_path"] = draw(st.sampled_from(["relative/tune", "/dev/null/x", "nosuch://b/x", "/tmp"]))
    if draw(st.booleans()):
        space["resources"] = draw(st.sampled_from([{"cpu": 1}, {"cpu": 0.01}, {"cpu": 64}, {"gpu": 1}, {"cpu": -1}]))
    params = {}
    if draw(st.booleans()):
        params["fl.batch_size"] = {"type": "int", "low": 8, "high": 16, "step": draw(st.sampled_from([1, 2, 0.5]))}
    if draw(st.booleans()):
        params["metadata.note"] = {"type": "categorical", "choices": draw(st.lists(HOSTILE_TEXT, min_size=1,
                                                                                     max_size=3, unique=True))}
    space["params"] = params
    text = yaml.safe_dump(space, allow_unicode=True)
    extra = draw(st.sampled_from(["", "", "bomb", "self", "huge"]))
    if extra == "bomb":
        text += "metadata_bomb:\n" + BOMB
    elif extra == "self":
        text += "loop: &l [*l]\n"
    elif extra == "huge":
        text += "padding: '" + "x" * (1 << 20) + "'\n"
    event(f"space extra: {extra or 'none'}")
    return text


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def call(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(args)
        except SystemExit as exit_:  # argparse
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue().strip()


@pytest.fixture(scope="module")
def stand_in_for_ray():
    """Stop where Ray would start; the 'run' records one finished trial (so a valid start exits 0)."""
    import optuna

    from autofl.tuning.tune import preflight

    from autofl.tuning.tune import ray_start

    from autofl.tuning.tune import runner

    def run_experiment(study, trials, address, restore=None, join=False, top_up=False):
        ot = optuna.create_study(study_name=study.name, storage=study.storage_url(), load_if_exists=True,
                                 direction="maximize")
        ot.tell(ot.ask(), 0.5)

    mp = pytest.MonkeyPatch()
    mp.setattr(ray_start, "start_ray", start_ray_without_ray)
    mp.setattr(preflight, "check_cluster_fits", lambda cpu, gpu, address: None)
    mp.setattr(runner, "run_experiment", run_experiment)
    yield mp
    mp.undo()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(text=space_texts(), name=st.one_of(st.none(), NAMES), env_storage=ENV_STORAGE,
       storage_path=st.one_of(st.none(), st.sampled_from(["", "rel/tune", "/dev/null", "nosuch://b", "[/x]"])),
       address=st.one_of(st.none(), st.none(), st.sampled_from([f"127.0.0.1:{PORT}", "bad:addr:x", "ray://[/x]"])),
       space_name=st.sampled_from(["space.yaml", "[bold]s.yaml", "s[v2].yaml", "s\x1b[1m.yaml", "s\u202e.yaml"]))
def test_hostile_search_starts_are_clean(stand_in_for_ray, monkeypatch, text, name, env_storage, storage_path,
                                         address, space_name):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with monkeypatch.context() as mp:
            mp.chdir(folder)
            if env_storage is None:
                mp.delenv("AUTOFL_STORAGE", raising=False)
            else:
                mp.setenv("AUTOFL_STORAGE", env_storage)
            (folder / space_name).write_text(text)
            (folder / "studies" / "other").mkdir(parents=True)
            (folder / "studies" / "other" / "space.yaml").write_text("study: other\n")
            before = hashes(folder)
            args = ["search", "--space", space_name, "--dir", "studies"]
            args += [] if name is None else ["--name", name]
            args += [] if storage_path is None else ["--storage-path", storage_path]
            args += [] if address is None else ["--address", address]
            code, out, err = call(args)
        assert code in (0, 2), (code, err)
        assert "Traceback" not in out + err
        assert SECRET not in out + err
        assert "\x1b[31m" not in err and "\u202e" not in err
        event(f"search exit {code}")
        if code == 2:
            assert 1 <= len(err.splitlines()) <= 3 and err.startswith("autofl: error: "), err
            assert hashes(folder) == before  # a refused start leaves nothing behind
        for path in folder.rglob("*"):  # what the command wrote (the user's own space file may hold it)
            made = str(path.relative_to(folder)) not in before
            if made and path.is_file() and not path.is_symlink() and path.stat().st_size < (4 << 20):
                assert SECRET.encode() not in path.read_bytes(), path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sets=st.lists(SET_VALUES, max_size=3), out=st.one_of(st.none(), HOSTILE_TEXT))
def test_hostile_train_arguments_are_clean(sets, out):
    assume(out is None or any(s not in ("fl.rounds=1", "metadata.x=\x1b[2J") for s in sets))  # no real training
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        earlier = folder / "earlier"
        earlier.mkdir()
        (earlier / "metrics.jsonl").write_text('{"round": 1}\n')
        before = hashes(folder)
        args = ["train", "--set", "fl.rounds=1", "--set", "data.num_clients=2", "--set", "runtime.device=cpu"]
        for item in sets:
            args += ["--set", item]
        target = str(earlier) if out is None else str(folder / out) if out else ""
        code, stdout, err = call([*args, "--out", target])
        assert code in (0, 2), (code, err)
        assert "Traceback" not in stdout + err and "\x1b[2J" not in stdout + err
        event(f"train exit {code}")
        if code == 2:
            assert 1 <= len(err.splitlines()) <= 3 and err.startswith("autofl: error: "), err
            assert hashes(folder) == before

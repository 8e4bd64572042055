"""Fuzzing the Python API's arguments (hypothesis): every wrongly typed or out-of-range argument of
a public call raises ArgumentError naming the call and the argument, before any work, and writes
nothing (issue 42: `out=123`, `trials="3"`, `trials=1.5`, `name=123`, `reevaluate(seeds=2.5)`,
`best_config(reeval={})` were raw TypeErrors or KeyErrors, and `trials=1.5` left a half-made study)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autofl
from autofl.errors import ArgumentError
from tests.test_hostile_input import study_with_trials

# values of no type any argument takes, plus the types some take (each argument below draws
# only from what it refuses)
OBJECTS = st.sampled_from([object(), b"bytes", bytearray(b"x"), {1, 2}, 1j, Ellipsis])
NUMBERS = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True))
TEXT = st.text(max_size=8)
CONTAINERS = st.one_of(st.lists(st.integers(0, 3), max_size=2), st.dictionaries(TEXT, st.integers(0, 3), max_size=2))
BOOLS = st.booleans()

NOT_A_PATH = st.one_of(OBJECTS, NUMBERS, BOOLS, CONTAINERS)
NOT_A_STR = st.one_of(OBJECTS, NUMBERS, BOOLS, CONTAINERS, st.builds(Path, st.just("x")))
NOT_A_FLAG = st.one_of(OBJECTS, NUMBERS, TEXT, CONTAINERS, st.none())
NOT_A_CALLBACK = st.one_of(NUMBERS, TEXT, BOOLS, CONTAINERS)
NOT_OVERRIDES = st.one_of(OBJECTS, NUMBERS, BOOLS, TEXT.filter(bool), st.lists(st.one_of(NUMBERS, st.none()),
                                                                                min_size=1, max_size=2))


def not_a_whole_number(low: int, high: float = math.inf, none_ok: bool = False):
    wrong = st.one_of(OBJECTS, TEXT, BOOLS, CONTAINERS, st.floats(allow_nan=True, allow_infinity=True),
                      st.integers(-10**9, low - 1), st.integers(min_value=int(min(high, 10**12)) + 1, max_value=10**15)
                      if high != math.inf else st.nothing())
    return wrong if none_ok else st.one_of(wrong, st.none())


NOT_ROWS = st.one_of(OBJECTS, NUMBERS, TEXT, BOOLS, st.lists(st.integers(0, 3), min_size=1, max_size=2))
NOT_A_DICT = st.one_of(OBJECTS, NUMBERS, TEXT, BOOLS, st.lists(st.integers(0, 3), max_size=2), st.none())
KINDS = ("methods", "models", "datasets")
STUDY_BASE = {"serve_dashboard": {"port": 8080}}  # the other arguments a call needs (never reached: refused first)

STUDY_CALLS = {  # argument -> (call, strategy of refused values)
    ("reevaluate", "seeds"): not_a_whole_number(2), ("reevaluate", "top"): not_a_whole_number(1),
    ("reevaluate", "vary_partition"): NOT_A_FLAG, ("reevaluate", "address"): NOT_A_STR,
    ("reevaluate", "verbose"): NOT_A_FLAG, ("reevaluate", "on_plan"): NOT_A_CALLBACK,
    ("reevaluate", "on_done"): NOT_A_CALLBACK,
    ("report", "out"): NOT_A_PATH,
    ("best_objective", "rows"): NOT_ROWS, ("feasibility_line", "rows"): NOT_ROWS, ("pareto_rows", "rows"): NOT_ROWS,
    ("serve_dashboard", "port"): not_a_whole_number(1, 65535), ("serve_dashboard", "on_ready"): NOT_A_CALLBACK,
    ("best_config", "reeval"): st.one_of(NOT_A_PATH.filter(lambda v: not isinstance(v, dict)),
                                         st.dictionaries(TEXT, st.integers(0, 3), max_size=3)),
}
MODULE_CALLS = {
    ("train", "out"): NOT_A_PATH, ("train", "overwrite"): NOT_A_FLAG, ("train", "overrides"): NOT_OVERRIDES,
    ("train", "on_round"): NOT_A_CALLBACK, ("train", "announce"): NOT_A_CALLBACK,
    ("train", "on_clients"): NOT_A_CALLBACK,
    ("load_config", "overrides"): NOT_OVERRIDES,
    ("search", "name"): NOT_A_STR, ("search", "trials"): not_a_whole_number(1, 100_000, none_ok=True),
    ("search", "dir"): NOT_A_PATH, ("search", "address"): NOT_A_STR, ("search", "resume"): NOT_A_FLAG,
    ("search", "join"): NOT_A_FLAG, ("search", "storage_path"): NOT_A_STR, ("search", "verbose"): NOT_A_FLAG,
    ("search", "on_start"): NOT_A_CALLBACK,
    ("load_study", "name"): st.one_of(NOT_A_STR, st.none()), ("load_study", "dir"): NOT_A_PATH,
    ("list_studies", "dir"): NOT_A_PATH,
    ("submit_slurm", "name"): NOT_A_STR, ("submit_slurm", "resume"): NOT_A_FLAG,
    ("submit_slurm", "trials"): not_a_whole_number(1, 100_000, none_ok=True), ("submit_slurm", "dir"): NOT_A_PATH,
    ("submit_slurm", "dry_run"): NOT_A_FLAG,
    ("config_text", "config"): NOT_A_DICT,
    ("config_text", "fmt"): st.one_of(OBJECTS, NUMBERS, BOOLS, st.none(), TEXT.filter(lambda t: t not in ("yaml", "json"))),
    ("list_entries", "kinds"): st.one_of(OBJECTS, NUMBERS, TEXT, st.none(),
                                         st.lists(TEXT.filter(lambda t: t not in KINDS), min_size=1, max_size=2)),
    ("slurm_options", "given"): NOT_A_DICT, ("slurm_options", "flags"): NOT_A_FLAG,
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    root = tmp_path_factory.mktemp("api_fuzz")
    study_with_trials(root, "fz", ["a", "b"])
    return root


def files_under(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def call_module(call: str, arg: str, value, home: Path):
    kwargs = {arg: value}
    if call == "train":
        return autofl.train({"fl": {"rounds": 1}}, **{"out": home / "run", **kwargs})
    if call == "load_config":
        return autofl.load_config({}, **kwargs)
    if call == "search":
        base = {"dir": home / "home", "name": "new"}
        return autofl.search({"study": "new", "trials": 1}, **{**base, **kwargs})
    if call == "submit_slurm":
        base = {"dir": home / "home", "name": "new", "dry_run": True}
        return autofl.submit_slurm({"study": "new", "trials": 1}, **{**base, **kwargs})
    if call == "config_text":
        return autofl.api.config_text(**{"config": {"fl": {"lr": 0.1}}, **kwargs})
    if call == "list_entries":
        return autofl.api.list_entries(**kwargs)
    if call == "slurm_options":
        return autofl.api.slurm_options(**{"given": {}, **kwargs})
    if call == "load_study":
        return autofl.load_study(**{"name": "fz", "dir": home / "home", **kwargs})
    return autofl.list_studies(**kwargs)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_wrong_argument_is_one_argument_error_and_writes_nothing(home, data):
    (call, arg), values = data.draw(st.sampled_from(sorted({**MODULE_CALLS, **STUDY_CALLS}.items(),
                                                           key=lambda kv: kv[0])), label="argument")
    value = data.draw(values, label="value")
    before = files_under(home)
    with pytest.raises(ArgumentError) as info:
        if (call, arg) in STUDY_CALLS:
            study = autofl.load_study("fz", dir=home / "home")
            getattr(study, call)(**{**STUDY_BASE.get(call, {}), arg: value})
        else:
            call_module(call, arg, value, home)
    line = str(info.value)
    assert line.startswith(f"{call}: {arg}=") and "allowed: " in line and "\n" not in line, line
    assert files_under(home) == before  # nothing written, nothing half-made

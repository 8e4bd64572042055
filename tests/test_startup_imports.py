"""Read-only commands start without the libraries they do not need (issue 42: every one imported
torch, 3.5 s on a quiet 2-core machine): each runs in a fresh interpreter and reports which heavy
modules it loaded. Asserts on modules, not on seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_hostile_input import study_with_trials

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray", "optuna")
PROBE = ("import contextlib, io, json, sys\n"
         "from autofl.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    try:\n"
         "        code = main(sys.argv[1:])\n"
         "    except SystemExit as exit_:\n"
         "        code = exit_.code\n"
         f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))\n")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    study_with_trials(root, "qs", ["a", "b"])  # trials without their config: as studies made before 2026-11-27
    study_with_trials(root, "stored", ["a", "b"], with_configs=True)  # as a search records them now
    return root / "home"


def loaded(*args) -> tuple[int, set[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)
    code, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    return code, set(modules)


@pytest.mark.parametrize("command, needs", [
    (("--help",), set()),
    (("search", "--help"), set()),
    (("studies",), {"optuna"}),  # the trials are read from Optuna's storage
    (("status", "qs"), {"optuna"}),
    # --reeval 0: the single-seed best, read (export re-evaluates on fresh seeds by default, which trains)
    (("best-config", "export", "qs", "--reeval", "0"), {"optuna", "torch"}),  # no stored config: its method's class
    (("best-config", "export", "stored", "--reeval", "0"), {"optuna"}),  # the best trial's config as stored
])
def test_read_only_commands_load_no_library_they_do_not_need(home, command, needs):
    args = [*command, "--dir", home] if "--help" not in command else list(command)
    code, modules = loaded(*args)
    assert code == 0
    assert modules <= needs, f"autofl {' '.join(command)} imported {sorted(modules - needs)}"


def test_the_stored_config_is_exported_as_resolving_it_anew_would(home, capsys):
    from autofl import api

    stored, anew = api.load_study("stored", home).best_config(), api.load_study("qs", home).best_config()
    for config in (stored, anew):
        config["metadata"].pop("study")
    assert stored == anew  # same space, same trials: only where the config came from differs


def test_python_m_autofl_runs_the_cli():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "autofl", "list", "--bogus"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--bogus" in proc.stderr


LIST_PROBE = ("import contextlib, io, json, sys\n"
              "from autofl.cli import main\n"
              "out = io.StringIO()\n"
              "with contextlib.redirect_stdout(out):\n"
              "    code = main(sys.argv[1:])\n"
              f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules], out.getvalue()]))\n")
GOOD_PLUGIN = {
    "goodplug/__init__.py": "",
    "goodplug/m.py": "from autofl.methods.base import Method\n\n\nclass Plain(Method):\n"
                     "    \"\"\"Plain: FedAvg under another name.\"\"\"\n\n    name = \"plain\"\n",
    "goodplug-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: goodplug\nVersion: 0.1\n",
    "goodplug-0.1.dist-info/entry_points.txt": "[autofl.methods]\nplain = goodplug.m:Plain\n",
}


def test_list_is_read_from_its_cache_without_torch_and_a_changed_plugin_is_read_anew(tmp_path):
    """`autofl list` imported every method's module (torch: 4-6 s); its rows are kept under a fingerprint
    of autofl's and the plugins' sources, so a second call imports nothing heavy, and an edited plugin
    (its file's size and time change) is read again."""
    site = tmp_path / "site"
    for rel, text in GOOD_PLUGIN.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(site), os.environ.get("PYTHONPATH", "")])}

    def listed() -> tuple[int, set[str], str]:
        proc = subprocess.run([sys.executable, "-c", LIST_PROBE, "list", "methods"], capture_output=True, text=True,
                              env=env, timeout=300)
        code, modules, out = json.loads(proc.stdout.strip().splitlines()[-1])
        return code, set(modules), " ".join(out.replace("│", " ").split())

    first = listed()
    assert first[0] == 0 and "torch" in first[1] and "plain goodplug Plain: FedAvg under another name." in first[2]
    assert len(list((tmp_path / "cache" / "autofl").glob("listing-*.json"))) == 1
    second = listed()
    assert second == (0, set(), first[2])
    (site / "goodplug" / "m.py").write_text(GOOD_PLUGIN["goodplug/m.py"].replace("another name", "a new name!"))
    third = listed()
    assert "torch" in third[1] and "Plain: FedAvg under a new name!" in third[2]
    assert len(list((tmp_path / "cache" / "autofl").glob("listing-*.json"))) == 1  # the old rows were dropped


def test_a_training_leaves_the_listing_for_the_first_list_after_an_install(tmp_path):
    """`autofl train` (and a search's driver) has imported every registry's entries: it keeps `autofl
    list`'s rows, so the first list after an install imports no torch (issue 42: 6.6 s cold)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "autofl", "train", "--set", "fl.rounds=1", "--out", tmp_path / "run"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-c", LIST_PROBE, "list", "methods"], capture_output=True, text=True,
                          env=env, timeout=300)
    code, modules, out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (code, modules) == (0, []) and "fdcl" in out and "fedavg" in out


def test_the_shipped_builtin_rows_are_the_live_ones():
    """autofl/builtin_listing.json is what reading the built-ins gives now, under the hash of the
    sources here: a changed built-in method, model or dataset fails this until the file is written anew."""
    from autofl.listing import BUILTIN_ROWS, Listed, builtin_rows, builtin_sources_hash, toolchain

    stale = "autofl/builtin_listing.json is stale: run python scripts/write_builtin_listing.py"
    shipped = json.loads(BUILTIN_ROWS.read_text())
    assert shipped["sources"] == builtin_sources_hash(), stale
    if shipped["toolchain"] != toolchain():  # type names may read otherwise: such an install reads the classes
        pytest.skip(f"the rows were written with {shipped['toolchain']}, this is {toolchain()}")
    assert [Listed(**row) for row in shipped["rows"]] == builtin_rows(), stale


def test_the_first_list_of_an_install_without_plugins_imports_no_torch(tmp_path):
    """The first `autofl list` after an install (an empty cache) imported every method's module: 7.6 s here
    (issue 42). Without plugins it shows the shipped built-in rows, and keeps them for the next call; where
    the shipped rows were not read from the sources here, it reads the classes, as before."""
    no_plugins = "import autofl.listing as listing\nlisting.plugins_installed = lambda: False\n"
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"sources": "another build", "rows": []}))

    def listed(patch: str, cache: str) -> tuple[int, set[str], str]:
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / cache),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", patch + LIST_PROBE, "list"], capture_output=True, text=True,
                              env=env, timeout=300)
        code, modules, out = json.loads(proc.stdout.strip().splitlines()[-1])
        return code, set(modules), " ".join(out.replace("│", " ").split())

    shipped = listed(no_plugins, "fresh")
    assert shipped[:2] == (0, set()) and "fdcl built-in FDCL" in shipped[2] and "digits built-in" in shipped[2]
    assert len(list((tmp_path / "fresh" / "autofl").glob("listing-*.json"))) == 1  # kept for the next call
    read = listed(no_plugins + f"listing.BUILTIN_ROWS = listing.Path({str(stale)!r})\n", "stale")
    assert read[0] == 0 and "torch" in read[1] and "fdcl built-in FDCL" in read[2]  # (with any plugin installed here)


def test_an_idle_studys_trials_come_from_its_snapshot_until_its_storage_is_written(tmp_path):
    """`studies`, `status` and `best-config export` of an idle study read the rows kept beside its storage
    while the storage's files are unchanged (no Optuna import: 2.3 s -> 0.6 s here); any write to the storage (here a trial
    added) makes them read it again, so they never show a stale study."""
    import optuna
    from optuna.distributions import FloatDistribution

    from autofl import api
    from autofl.tuning.store.study import SETTLED_S, TRIALS_SNAPSHOT

    root = study_with_trials(tmp_path, "snap", ["a", "b"], with_configs=True)
    home = root.parent
    # the first read puts the file (made by plain Optuna) in WAL mode, as a search's storage is: a write
    assert loaded("status", "snap", "--dir", home)[1] == {"optuna"}
    time.sleep(SETTLED_S)  # rows are kept only from a storage still for that long (a write may not show sooner)
    assert loaded("status", "snap", "--dir", home)[1] == {"optuna"}  # read from the storage, then kept
    assert (root / TRIALS_SNAPSHOT).exists()
    assert loaded("status", "snap", "--dir", home) == (0, set())
    assert loaded("studies", "--dir", home) == (0, set())
    assert loaded("best-config", "export", "snap", "--reeval", "0", "--dir", home) == (0, set())  # the row keeps it
    kept = api.load_study("snap", home).trials()
    assert [r["number"] for r in kept] == [0, 1, 2] and all(r["feasible"] for r in kept)

    storage = optuna.storages.RDBStorage(f"sqlite:///{root / 'optuna.db'}")
    optuna.load_study(study_name="snap", storage=storage).add_trial(optuna.trial.create_trial(
        params={"fl.lr": 0.09}, distributions={"fl.lr": FloatDistribution(0.01, 0.1)}, value=0.9))
    storage.engine.dispose()  # as a search's driver does when it ends
    fresh = api.load_study("snap", home).trials()
    assert [r["number"] for r in fresh] == [0, 1, 2, 3] and fresh[3]["objective"] == 0.9
    time.sleep(SETTLED_S)
    assert loaded("status", "snap", "--dir", home)[1] == {"optuna"}  # the storage is still now: kept again
    assert loaded("status", "snap", "--dir", home) == (0, set())

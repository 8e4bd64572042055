"""Issue 18, the second hostile sweep: each class of bad input is one line and exit 2, within
seconds, leaving nothing half-made and no secret anywhere. No test here starts Ray (the ones
that must are in test_hostile_ray.py)."""

from __future__ import annotations

import json
import os
import stat
import socket
import time
from pathlib import Path

import pytest
import yaml

from autofl.cli import main
from conftest import start_ray_without_ray

SECRET = "S3cret-in-query-9d1"


def files_under(folder: Path) -> set[Path]:
    return set(folder.rglob("*")) if folder.exists() else set()


def cli(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def assert_one_line(code: int, err: str, expected: str, exit_code: int = 2) -> None:
    assert code == exit_code and len(err.splitlines()) == 1 and expected in err, (code, err)
    assert err.startswith("autofl: error: ") and "Traceback" not in err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fine_space(tmp_path: Path, name: str = "fine", **extra) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"study": name, "trials": 2, **extra}))
    return path


@pytest.fixture
def no_ray(monkeypatch):
    """Stop where Ray would start: record the runs the search would make instead."""
    from autofl.tuning.tune import preflight
    from autofl.tuning.tune import ray_start
    from autofl.tuning.tune import runner

    import optuna

    runs: list[tuple] = []

    def run_experiment(study, trials, address, restore=None, join=False, top_up=False):
        runs.append((study.name, trials, restore))
        ot = optuna.create_study(study_name=study.name, storage=study.storage_url(), load_if_exists=True,
                                 direction="maximize")
        for _ in range(trials):
            ot.tell(ot.ask(), 0.5)

    monkeypatch.setattr(ray_start, "start_ray", start_ray_without_ray)
    monkeypatch.setattr(preflight, "check_cluster_fits", lambda cpu, gpu, address: None)
    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    return runs


# ----- (1) a password in the storage URL's query --------------------------------------------------

QUERY_FORMS = [f"?password={SECRET}", f"?PASSWORD={SECRET}", f"?pass%77ord={SECRET}", f"?sslpassword={SECRET}",
               f"?sslmode=prefer&Password={SECRET}"]


@pytest.mark.parametrize("query", QUERY_FORMS)
def test_a_password_in_the_storage_query_is_refused_and_never_shown(tmp_path, capsys, query):
    space = fine_space(tmp_path, storage=f"postgresql+psycopg://autofl@127.0.0.1:{free_port()}/autofl{query}")
    home = tmp_path / "home"
    before = files_under(tmp_path)
    code, out, err = cli(capsys, "search", "--space", space, "--dir", home)
    assert_one_line(code, err, "holds a password")
    assert SECRET not in out + err
    assert files_under(tmp_path) == before


def test_a_password_in_autofl_storage_is_masked_and_never_recorded(tmp_path, capsys, monkeypatch):
    from autofl.tuning.store import study as st
    from autofl.tuning.strategy.space import load_space
    from autofl.text import mask_url

    url = f"postgresql+psycopg://autofl@127.0.0.1:{free_port()}/autofl?sslmode=prefer&password={SECRET}"
    monkeypatch.setenv("AUTOFL_STORAGE", url)
    space = fine_space(tmp_path)
    home = tmp_path / "home"
    code, out, err = cli(capsys, "search", "--space", space, "--dir", home)  # nothing listens there
    assert_one_line(code, err, "storage: cannot open")
    assert SECRET not in out + err and not home.exists()
    # what a study records: the URL without its password, which comes from the environment again
    recorded = st.new_study_storage(load_space(space))
    assert SECRET not in recorded and "sslmode=prefer" in recorded
    assert SECRET not in mask_url(f"failed: {url} and host=h password={SECRET} user=u")
    monkeypatch.setattr("autofl.tuning.store.study.probe_storage", lambda url: None)
    study = st.create_study(home, space, load_space(space), None)
    assert all(SECRET not in p.read_text() for p in files_under(study.root) if p.is_file())


# ----- (2) trial resources no node has --------------------------------------------------------------

@pytest.mark.parametrize(("cpu", "gpu", "field"), [(1, 1, "resources.gpu"), (64, 0, "resources.cpu"),
                                                    (1, 2, "resources.gpu")])
def test_resources_no_node_has_are_refused(cpu, gpu, field):
    from autofl.errors import ConfigError
    from autofl.tuning.tune.preflight import check_trial_fits

    two_cores = [{"CPU": 2.0, "memory": 4e9}]
    with pytest.raises(ConfigError, match=field):
        check_trial_fits(cpu, gpu, two_cores if gpu != 2 else [{"CPU": 8.0, "GPU": 1.0}], None)
    check_trial_fits(2, 0, two_cores, None)  # what fits is accepted
    # a cluster's totals: two nodes of 2 cores and one GPU each hold a trial of 4 CPUs only as a whole
    check_trial_fits(4, 2, [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}], "10.0.0.5:6379")


# ----- (3) the enqueued paper default never eats the budget -----------------------------------------

def test_start_points_never_exceed_the_runs_budget(tmp_path):
    """A cross-method study with fewer trials than methods enqueued a start point per method: the
    ones beyond its budget stayed WAITING forever (and counted against a shared budget)."""
    import optuna

    from autofl.tuning.store import study as st
    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.strategy.space import load_space
    from autofl.tuning.tune.experiment import make_searcher

    path = tmp_path / "cross.yaml"
    path.write_text(yaml.safe_dump({"study": "cross", "trials": 1, "params": {
        "method.name": {"type": "categorical", "choices": ["fedavg", "fedprox", "fdcl"]}}}))
    study = st.create_study(tmp_path / "home", path, load_space(path), None)
    make_searcher(study.space(), Ledger(study.root), "run-1", 1, with_start_point=True)
    waiting = optuna.load_study(study_name="cross", storage=study.storage_url()).get_trials(
        states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1  # main: 3, two of them never run


# ----- (4) an unreachable --address -------------------------------------------------------------------

@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "bad:address:x"])
def test_an_unreachable_address_is_one_line_within_seconds_and_makes_nothing(tmp_path, capsys, address):
    address = address.format(port=free_port())
    space = fine_space(tmp_path)
    home = tmp_path / "home"
    started = time.monotonic()
    code, out, err = cli(capsys, "search", "--space", space, "--dir", home, "--address", address)
    assert_one_line(code, err, "--address")
    assert time.monotonic() - started < 30 and not home.exists()


def test_resume_of_a_study_whose_start_failed_runs_its_trials(tmp_path, capsys, no_ray):
    """A study made before its start failed (Ray did not start, the machine rebooted): --resume
    used to run nothing and exit 0."""
    from autofl.tuning.store import study as st
    from autofl.tuning.strategy.space import load_space

    space = fine_space(tmp_path, name="half")
    st.create_study(tmp_path / "home", space, load_space(space), None)
    code, out, err = cli(capsys, "search", "--resume", "half", "--dir", tmp_path / "home")
    assert code == 0, err
    assert no_ray == [("half", 2, None)]


def test_a_start_that_fails_after_the_folder_exists_leaves_no_study(tmp_path, capsys, no_ray, monkeypatch):
    from autofl.tuning.tune import ray_start

    def ray_fails(root, address, verbose, meanwhile=None):
        (Path(root) / "logs").mkdir()
        raise RuntimeError("Failed to start the GCS\nsecond line")

    monkeypatch.setattr(ray_start, "start_ray", ray_fails)
    home = tmp_path / "home"
    (home / "mine").mkdir(parents=True)
    (home / "mine" / "notes.txt").write_text("keep me")
    for name in ("fresh", "mine"):
        code, out, err = cli(capsys, "search", "--space", fine_space(tmp_path), "--name", name, "--dir", home)
        assert_one_line(code, err, "ray: could not start (Failed to start the GCS second line)")
    assert files_under(home) == {home / "mine", home / "mine" / "notes.txt"}  # the user's file stays


def test_an_error_while_resources_resolve_beside_rays_start_is_one_line_and_leaves_no_study(
    tmp_path, capsys, no_ray, monkeypatch
):
    """The space's resources (`population: auto`'s dry rounds) resolve in a thread while Ray starts: what
    fails there reaches the user as it did in the driver's own thread, and the new study is rolled back."""
    from autofl.errors import ConfigError
    from autofl.tuning.strategy.space import SearchSpace

    def fails(self, recorded_population=None, population=True, trials=None):
        raise ConfigError("resources.population: the dry round failed")

    monkeypatch.setattr(SearchSpace, "resolve_resources", fails)
    home = tmp_path / "home"
    code, out, err = cli(capsys, "search", "--space", fine_space(tmp_path), "--name", "fresh", "--dir", home)
    assert_one_line(code, err, "resources.population: the dry round failed")
    assert not (home / "fresh").exists() and no_ray == []


def test_start_ray_raises_what_failed_beside_rays_start_once_ray_started(tmp_path, monkeypatch):
    """`start_ray`'s `meanwhile` runs in a thread: what it raises is raised in the caller's thread, after
    Ray's start returned (the stubs above run it in the caller's thread, so they cannot show this)."""
    from autofl.errors import ConfigError
    from autofl.tuning.tune import ray_start

    started: list[str | None] = []
    monkeypatch.setattr(ray_start, "tune_environment", lambda: None)
    monkeypatch.setattr(ray_start, "route_driver_logs", lambda root, verbose: root / "logs")
    monkeypatch.setattr(ray_start, "init_ray", lambda address, worker_log, verbose: started.append(address))

    def fails() -> None:
        raise ConfigError("resources.population: the dry round failed")

    with pytest.raises(ConfigError, match="the dry round failed"):
        ray_start.start_ray(tmp_path, None, False, meanwhile=fails)
    assert started == [None]
    assert ray_start.start_ray(tmp_path, None, False, meanwhile=lambda: None) == tmp_path / "logs"


# ----- (5) YAML alias bombs and huge files ----------------------------------------------------------

BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['x'] * 9)}]\n"
               for p, a in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh"))


@pytest.mark.parametrize("kind", ["bomb", "self", "huge", "deep"])
def test_yaml_alias_bombs_and_huge_files_are_refused_in_one_line(tmp_path, capsys, kind):
    text = {"bomb": "metadata:\n" + "".join("  " + line + "\n" for line in BOMB.splitlines()),
            "self": "metadata: &m {loop: *m}\n",
            "huge": "metadata:\n  note: '" + "x" * (2 << 20) + "'\n",
            "deep": "metadata: " + "[" * 20000 + "]" * 20000 + "\n"}[kind]
    config = tmp_path / "config.yaml"
    config.write_text(text)
    space = tmp_path / "space.yaml"
    space.write_text("study: s\n" + text.replace("metadata:", "base:\n  metadata:", 1) if kind != "huge" else
                     "study: s\n" + text)
    before = files_under(tmp_path)
    started = time.monotonic()
    for args in (["train", "--config", config, "--out", tmp_path / "run"],
                 ["search", "--space", space, "--dir", tmp_path / "home"]):
        code, out, err = cli(capsys, *args)
        assert_one_line(code, err, "refused")
    assert time.monotonic() - started < 30 and files_under(tmp_path) == before


def test_a_set_value_that_is_an_alias_bomb_is_refused():
    from autofl.config import apply_overrides
    from autofl.errors import ConfigError

    flow = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + [
        f"&{b} [{', '.join([f'*{a}'] * 10)}]" for a, b in zip("abcd", "bcde")]) + "]"
    with pytest.raises(ConfigError, match="--set metadata.x: value refused"):
        apply_overrides({}, [f"metadata.x={flow}"])


# ----- the Low paragraph: paths that are not files ---------------------------------------------------

def test_a_folder_or_a_device_as_config_is_named_for_what_it_is(tmp_path, capsys):
    code, out, err = cli(capsys, "train", "--config", tmp_path)
    assert_one_line(code, err, "is a folder")
    code, out, err = cli(capsys, "search", "--space", "/dev/null", "--dir", tmp_path / "home")
    assert_one_line(code, err, "not a regular file")


def test_concurrency_is_bounded_by_memory_as_well():
    from autofl.tuning.tune.preflight import TRIAL_MEMORY_BYTES
    from autofl.tuning.tune.ray_start import concurrent_slots
    from autofl.tuning.strategy.space import SearchSpace

    tiny = SearchSpace(study="s", resources={"cpu": 0.25})
    assert concurrent_slots({"CPU": 2.0}, tiny) == 8  # Ray reported no memory: the cores decide
    assert concurrent_slots({"CPU": 2.0, "memory": 3.5 * TRIAL_MEMORY_BYTES}, tiny) == 3
    assert concurrent_slots({"CPU": 2.0, "memory": 0.2 * TRIAL_MEMORY_BYTES}, tiny) == 1


def test_bad_study_starts_are_refused_before_the_folder_exists(tmp_path, capsys):
    home = tmp_path / "home"
    (tmp_path / "afile").write_text("x")
    cases = {
        "step": ({"params": {"fl.batch_size": {"type": "int", "low": 8, "high": 64, "step": 0.5}}}, [],
                 "int step must be a whole number"),
        "memory": ({"storage": "sqlite:///:memory:"}, [], "in-memory database"),
        "empty": ({"storage": "sqlite://"}, [], "in-memory database"),
        "relative": ({"storage": "sqlite:///rel.db"}, [], "relative path"),
        "file_path": ({}, ["--storage-path", tmp_path / "afile"], "is a file"),
        "under_file": ({}, ["--storage-path", tmp_path / "afile" / "sub"], "cannot be made here"),
        "bad_uri": ({}, ["--storage-path", "nosuchscheme://bucket/x"], "cannot be used"),
        "space_rel": ({"storage_path": "relative/tune"}, [], "storage_path: 'relative/tune' is relative"),
    }
    before = files_under(tmp_path)
    for name, (extra, args, expected) in cases.items():
        space = fine_space(tmp_path, name=name, **extra)
        code, out, err = cli(capsys, "search", "--space", space, "--dir", home, *args)
        assert_one_line(code, err, expected)
        space.unlink()
    assert files_under(tmp_path) == before


def test_a_relative_storage_path_is_recorded_absolute(tmp_path, capsys, no_ray, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "search", "--space", fine_space(tmp_path), "--dir", "home",
                         "--storage-path", "shared/tune")
    assert code == 0, err
    meta = json.loads((tmp_path / "home" / "fine" / "study.json").read_text())
    assert meta["storage_path"] == str(tmp_path / "shared" / "tune")


# ----- (6) no writes through links planted in a study folder ----------------------------------------

def test_the_atomic_writer_and_the_lock_never_write_through_a_planted_link(tmp_path):
    from autofl.errors import OutputError, StorageError
    from autofl.files import write_atomic
    from autofl.tuning.store.driver_lock import DriverLock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json.tmp").symlink_to(victim)  # the atomic writer's temp name
    write_atomic(study / "study.json", '{"runs": []}')
    assert victim.read_text() == "precious" and (study / "study.json").read_text() == '{"runs": []}'
    (study / "report.html").symlink_to(victim)  # the target name itself: refused (issue 42), link and target kept
    with pytest.raises(OutputError, match="report.html: is a symbolic link"):
        write_atomic(study / "report.html", "<html>")
    assert victim.read_text() == "precious" and (study / "report.html").is_symlink()
    (study / "driver.lock").symlink_to(victim)
    lock = DriverLock(study)
    assert lock.is_held() is False
    with pytest.raises(StorageError, match="symbolic link"):
        lock.acquire(sqlite=True)
    assert victim.read_text() == "precious"


def test_report_refuses_a_planted_report_link(tmp_path, capsys):
    from autofl.tuning.store import study as st
    from autofl.tuning.strategy.space import load_space

    space = fine_space(tmp_path, name="linked")
    study = st.create_study(tmp_path / "home", space, load_space(space), None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (study.root / "report").symlink_to(elsewhere)
    code, out, err = cli(capsys, "report", "linked", "--dir", tmp_path / "home")
    assert_one_line(code, err, "symbolic link")
    assert list(elsewhere.iterdir()) == []


# ----- (8) rich markup and control characters in user text ------------------------------------------

def test_markup_and_control_characters_in_user_text_are_shown_as_text(tmp_path, capsys):
    from autofl.text import clean

    assert clean("a\x1b[31mb\u202ec\rd\te") == "a\\x1b[31mb\\u202ec\\rd\te"
    for args, expected in (
            (["search", "--space", tmp_path / "[/bold]x.yaml", "--dir", tmp_path / "home"], "[/bold]x.yaml: no such"),
            (["train", "--config", tmp_path / "configs[v2].yaml"], "configs[v2].yaml: no such"),
            (["train", "--config", tmp_path / "a\x1b[2Jb\u202e.yaml"], "a\\x1b[2Jb\\u202e.yaml: no such")):
        code, out, err = cli(capsys, *args)
        assert_one_line(code, err, expected)
        assert "\x1b" not in err and "\u202e" not in err


def study_with_trials(tmp_path: Path, name: str, values: list, with_configs: bool = False) -> Path:
    """A study whose SQLite storage holds finished trials (written with Optuna, no Ray); with
    `with_configs`, each trial keeps its resolved config as a search's searcher records it."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from autofl.tuning.store import study as st
    from autofl.tuning.strategy.space import load_space

    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"study": name, "trials": 3, "base": {"fl": {"rounds": 2}}, "params": {
        "fl.lr": {"type": "float", "low": 0.01, "high": 0.1},
        "metadata.note": {"type": "categorical", "choices": values}}}))
    study = st.create_study(tmp_path / "home", path, load_space(path), None)
    ot = optuna.create_study(study_name=name, storage=study.storage_url(), direction="maximize")
    dists = {"fl.lr": FloatDistribution(0.01, 0.1), "metadata.note": CategoricalDistribution(values)}
    for i in range(3):
        params = {"fl.lr": 0.02 * (i + 1), "metadata.note": values[i % len(values)]}
        config = {st.CONFIG_ATTR: st.resolved_config(study.space(), params)} if with_configs else {}
        ot.add_trial(optuna.trial.create_trial(
            params=params, distributions=dists,
            value=0.1 * (i + 1), intermediate_values={1: 0.05 * (i + 1), 2: 0.1 * (i + 1)},
            user_attrs={"round": 2, "fail_reason": "\x1b[2J[/x]", **config}))
    return study.root


def test_status_and_report_show_markup_escapes_and_dollars_in_values_as_text(tmp_path, capsys):
    values = ["[/x]", "\x1b[31mred\u202e", "$\\frac{1}{$"]
    study_with_trials(tmp_path, "hostile", values)
    code, out, err = cli(capsys, "status", "hostile", "--dir", tmp_path / "home")
    assert code == 0, err
    assert "[/x]" in out and "\\x1b[31mred\\u202e" in out and "\x1b[31m" not in out and "\u202e" not in out
    code, out, err = cli(capsys, "report", "hostile", "--dir", tmp_path / "home")  # mathtext crashed on `$`
    assert code == 0, err
    assert (tmp_path / "home" / "hostile" / "report" / "report.html").is_file()


# ----- (9) a study whose storage cannot be opened ---------------------------------------------------

def test_an_unopenable_storage_is_one_line_and_studies_lists_the_rest(tmp_path, capsys):
    from autofl.tuning.store import study as st
    from autofl.tuning.strategy.space import load_space

    study_with_trials(tmp_path, "good", ["a", "b"])
    home = tmp_path / "home"
    pg = fine_space(tmp_path, name="pgstudy", storage=f"postgresql+psycopg://autofl@127.0.0.1:{free_port()}/db")
    (home / "pgstudy").mkdir()
    (home / "pgstudy" / "space.yaml").write_text(pg.read_text())  # made where PGPASSWORD was set, say
    corrupt = st.create_study(home, fine_space(tmp_path, name="corrupt"), load_space(fine_space(tmp_path,
                                                                                               name="corrupt")), None)
    (corrupt.root / "optuna.db").write_bytes(b"this is not a database" * 100)
    for name in ("pgstudy", "corrupt"):
        for args in (["status", name], ["best-config", "export", name], ["report", name]):
            code, out, err = cli(capsys, *args, "--dir", home)
            assert_one_line(code, err, "storage: cannot open")
    code, out, err = cli(capsys, "studies", "--dir", home)
    assert code == 0, err
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│") or line.startswith("┃")
             if len(line.split()) > 1}
    assert "unreadable" in lines["pgstudy"] and "unreadable" in lines["corrupt"] and "3" in lines["good"]


def test_a_corrupt_study_record_is_one_line(tmp_path, capsys):
    root = study_with_trials(tmp_path, "rec", ["a"])
    (root / "study.json").write_text("{not json")
    code, out, err = cli(capsys, "search", "--resume", "rec", "--dir", tmp_path / "home")
    assert_one_line(code, err, "study.json: cannot be read")


@pytest.mark.parametrize("name", ["a..b", "x" * 150, "y" * 300])
def test_a_space_study_name_follows_the_name_rules(tmp_path, capsys, name):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"study": name, "trials": 1}))
    code, out, err = cli(capsys, "search", "--space", path, "--dir", tmp_path / "home")
    assert_one_line(code, err, "is not a study name")
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())


# ----- (10) a study copied under a new folder name --------------------------------------------------

def test_a_study_copied_under_a_new_name_shows_its_trials(tmp_path, capsys):
    import shutil

    root = study_with_trials(tmp_path, "original", ["a", "b"])
    shutil.copytree(root, root.parent / "mycopy")
    code, out, err = cli(capsys, "status", "mycopy", "--dir", tmp_path / "home")
    assert code == 0, err
    assert "trials: 3 complete" in out


def test_dashboard_refuses_a_taken_or_impossible_port(tmp_path, capsys):
    pytest.importorskip("optuna_dashboard")
    study_with_trials(tmp_path, "dash", ["a"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = cli(capsys, "dashboard", "dash", "--port", port, "--dir", tmp_path / "home")
        assert_one_line(code, err, f"--port {port}: cannot listen")
    code, out, err = cli(capsys, "dashboard", "dash", "--port", 70000, "--dir", tmp_path / "home")
    assert_one_line(code, err, "at most 65535")


# ----- the Low paragraph ------------------------------------------------------------------------------

def test_low_items_are_one_line_with_the_right_exit_code(tmp_path, capsys, monkeypatch):
    (tmp_path / "afile").write_text("x")
    space = fine_space(tmp_path)
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)
    cases = [
        (["train", "--set", "fl.rounds=true", "--out", tmp_path / "r1"], "fl.rounds: true is a boolean"),
        (["train", "--set", "runtime.threads=100000", "--out", tmp_path / "r2"], "runtime.threads"),
        (["train", "--out", ""], "--out: empty"),
        (["search", "--space", space, "--name", "", "--dir", tmp_path / "home"], "--name: empty"),
        (["search", "--resume", "fine", "--space", space, "--dir", tmp_path / "home"], "--space: applies to a new"),
        (["search", "--resume", "fine", "--name", "x", "--dir", tmp_path / "home"], "--name: applies to a new"),
        (["search", "--space", space, "--trials", "100000000000000000000", "--dir", tmp_path / "home"],
         "at most 100000"),
        (["search", "--space", space, "--dir", tmp_path / "afile" / "home"], "is a file"),
        (["dashboard", "fine", "--port", "70000", "--dir", tmp_path / "home"], "at most 65535"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append((["search", "--space", space, "--dir", readonly / "home"], "is not writable"))
    import torch

    if not torch.cuda.is_available():
        cases.append((["train", "--set", "runtime.device=cuda", "--out", tmp_path / "r3"], "runtime.device: 'cuda'"))
    before = files_under(tmp_path)
    for args, expected in cases:
        code, out, err = cli(capsys, *args)
        assert_one_line(code, err, expected)
    assert files_under(tmp_path) == before
    path = tmp_path / "trials.yaml"
    path.write_text("study: big\ntrials: 1.0e+20\n")
    code, out, err = cli(capsys, "search", "--space", path, "--dir", tmp_path / "home")
    assert_one_line(code, err, "trials")


def test_train_over_the_current_folder_is_refused(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    monkeypatch.chdir(run)
    code, out, err = cli(capsys, "train", "--out", ".", "--overwrite", "--set", "fl.rounds=1")
    assert_one_line(code, err, "holds the current folder")
    assert (run / "metrics.jsonl").read_text() == '{"round": 1}\n'


def test_a_corrupt_mnist_label_file_is_one_line(tmp_path, capsys):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    source = Path(os.environ.get("AUTOFL_DATA_ROOT", "/nonexistent")) / "MNIST" / "raw"
    if not source.is_dir():
        pytest.skip("needs MNIST under AUTOFL_DATA_ROOT")
    for f in source.iterdir():
        if not f.name.endswith(".gz"):
            (raw / f.name).write_bytes(f.read_bytes())
    (raw / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + b"\xff" * 64)  # header lies about length
    code, out, err = cli(capsys, "train", "--set", f"data.root={tmp_path}", "--set", "data.dataset=mnist",
                         "--out", tmp_path / "r")
    assert_one_line(code, err, "corrupt")


def test_a_full_or_closed_stdout_is_one_line(tmp_path):
    import subprocess
    import sys

    root = study_with_trials(tmp_path, "out", ["a"])
    args = [sys.executable, "-m", "autofl.cli", "studies", "--dir", str(root.parent)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot write the output" in proc.stderr
    proc = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                          pass_fds=(), close_fds=True, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_search_whose_every_trial_failed_exits_nonzero(tmp_path, capsys, no_ray, monkeypatch):
    import optuna

    from autofl.tuning.tune import runner

    def all_fail(study, trials, address, restore=None, join=False):
        ot = optuna.create_study(study_name=study.name, storage=study.storage_url())
        for _ in range(trials):
            ot.tell(ot.ask(), state=optuna.trial.TrialState.FAIL)

    monkeypatch.setattr(runner, "run_experiment", all_fail)
    code, out, err = cli(capsys, "search", "--space", fine_space(tmp_path, name="failing"), "--dir", tmp_path / "home")
    assert code == 1 and "has no finished trial" in err and len(err.splitlines()) == 1, err


def test_resuming_a_finished_study_says_how_to_add_trials(tmp_path, capsys, no_ray, monkeypatch):
    from autofl.tuning.tune import runner

    study_with_trials(tmp_path, "done", ["a"])
    root = tmp_path / "home" / "done"
    (root / "study.json").write_text('{"runs": [{"name": "run-1", "trials": 3}], "trials_requested": 3}')
    monkeypatch.setattr(runner, "interrupted_run", lambda study: None)
    monkeypatch.setattr(runner, "_flag_exists", lambda location: True)
    code, out, err = cli(capsys, "search", "--resume", "done", "--dir", tmp_path / "home")
    assert code == 0, err
    assert "add more with: autofl search --resume done --trials N" in out


def test_reeval_with_an_unreachable_address_is_one_line(tmp_path, capsys):
    study_with_trials(tmp_path, "re", ["a"])
    capsys.readouterr()  # Optuna's note on the study it made
    for args in (["reeval", "re", "--seeds", "2"], ["best-config", "export", "re", "--reeval", "2"]):
        code, out, err = cli(capsys, *args, "--address", f"127.0.0.1:{free_port()}", "--dir", tmp_path / "home")
        assert_one_line(code, err, "nothing answers")


def test_a_new_study_never_writes_through_links_planted_in_its_folder(tmp_path, capsys, no_ray):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "home" / "planted"
    (folder / "logs").mkdir(parents=True)
    (folder / "space.yaml").symlink_to(tmp_path / "dangling.yaml")  # a dangling link: not a study yet
    (folder / "logs" / "driver.log").symlink_to(victim)
    code, out, err = cli(capsys, "search", "--space", fine_space(tmp_path, name="planted"), "--dir", tmp_path / "home")
    # issue 42: a file autofl writes is never written over a link either: one line, nothing written
    assert_one_line(code, err, "planted/space.yaml: is a symbolic link")
    assert victim.read_text() == "precious" and not (tmp_path / "dangling.yaml").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["logs", "space.yaml"]
    import logging

    from autofl.tuning.tune.logs import route_driver_logs

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        route_driver_logs(folder, verbose=False)
        logging.getLogger("autofl.test").warning("a line for driver.log")
    finally:
        for handler in set(root.handlers) - set(before):
            root.removeHandler(handler)
            handler.close()
    assert victim.read_text() == "precious" and "a line for driver.log" in (folder / "logs" / "driver.log").read_text()


def test_reeval_of_a_study_whose_resources_no_node_has_is_one_line(tmp_path, capsys, monkeypatch):
    from autofl.tuning.tune import preflight
    from autofl.tuning.tune import ray_start

    root = study_with_trials(tmp_path, "gpuless", ["a"])
    space = yaml.safe_load((root / "space.yaml").read_text())
    (root / "space.yaml").write_text(yaml.safe_dump({**space, "resources": {"cpu": 1, "gpu": 1}}))
    capsys.readouterr()
    monkeypatch.setattr(ray_start, "start_ray", start_ray_without_ray)
    monkeypatch.setattr(preflight, "node_resources", lambda: [{"CPU": 2.0, "memory": 4e9}])
    code, out, err = cli(capsys, "reeval", "gpuless", "--seeds", "2", "--dir", tmp_path / "home")
    assert_one_line(code, err, "resources.gpu: a trial asks for 1 GPU")


# ----- issue 42: outputs only as regular files, never through or over a link, FIFO or device ---------

def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"out-{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "victim.yaml").write_text("precious")
        path.symlink_to(tmp_path / "victim.yaml")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "nowhere.yaml")
    else:  # a copy of /dev/null's node, as the reproduction made
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root")
    return path


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling", "device"])
def test_the_shared_writer_never_writes_over_a_special_file(tmp_path, kind):
    from autofl.errors import OutputError
    from autofl.files import write_atomic

    path = _special(tmp_path, kind)
    before = os.lstat(path)
    with pytest.raises(OutputError, match=r"out-\w+.yaml: is a (FIFO|symbolic link|device); autofl writes its output"):
        write_atomic(path, "x: 1\n")
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    assert not (tmp_path / "nowhere.yaml").exists() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    if kind == "symlink":
        assert (tmp_path / "victim.yaml").read_text() == "precious"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_export_refuses_a_special_output_before_any_work(tmp_path, capsys, kind, overwrite):
    path = _special(tmp_path, kind)
    before = os.lstat(path)
    code, out, err = cli(capsys, "best-config", "export", "nosuch", "--dir", tmp_path / "home", "-o", path,
                         *(["--overwrite"] if overwrite else []))
    assert_one_line(code, err, f"-o {path}: is a ")
    assert "pass --overwrite" not in err and os.lstat(path).st_ino == before.st_ino


def test_train_refuses_an_out_folder_that_is_a_link(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    code, out, err = cli(capsys, "train", "--out", tmp_path / "link", "--set", "fl.rounds=1")
    assert_one_line(code, err, f"--out {tmp_path / 'link'}: is a symbolic link")
    assert list(real.iterdir()) == []

"""The space's `sampler:` and `scheduler:`: Optuna's and Tune's own objects with the options given,
invalid combinations refused in one line (exit 2) before Ray starts, and a tiny study with a
non-default sampler and scheduler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from ray.tune.schedulers import MedianStoppingRule

from autofl.errors import ConfigError
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.tune.scheduler import StudyASHA
from autofl.tuning.strategy.space import SearchSpace, load_space
from autofl.tuning.strategy.space import grid_size
from autofl.tuning.strategy.build import make_sampler, make_scheduler

LR = {"type": "float", "low": 0.01, "high": 0.1, "log": True}
MOMENTUM = {"type": "categorical", "choices": [0.0, 0.9]}


def _write(tmp_path, **changes):
    space = {"study": "st", "base": {"fl": {"rounds": 4}}, "params": {"fl.lr": LR}, **changes}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.parametrize("sampler,cls", [(None, optuna.samplers.RandomSampler),
                                         ({"kind": "tpe"}, optuna.samplers.TPESampler)])
def test_default_is_seeded_random_search_tpe_has_autofl_options_and_asha(tmp_path, sampler, cls):
    space = load_space(_write(tmp_path, seed=7, **({"sampler": sampler} if sampler else {})))
    assert type(make_sampler(space).current) is cls and space.sampler.skip_repeats
    # the seed fixes the proposals: two samplers built from one space propose the same values
    values = []
    for _ in range(2):
        study = optuna.create_study(sampler=make_sampler(space), direction="maximize")
        study.optimize(lambda t: -(t.suggest_float("x", 0, 1) - 0.3) ** 2, n_trials=14)
        values.append([t.params["x"] for t in study.trials])
    assert values[0] == values[1]
    scheduler = make_scheduler(space, Ledger(tmp_path))
    assert isinstance(scheduler, StudyASHA) and scheduler.brackets == 1


@pytest.mark.parametrize("sampler,cls", [
    ({"kind": "random"}, optuna.samplers.RandomSampler),
    ({"kind": "gp", "n_startup_trials": 4}, optuna.samplers.GPSampler),
    ({"kind": "cmaes", "popsize": 6, "with_margin": True}, optuna.samplers.CmaEsSampler),
    ({"kind": "qmc", "qmc_type": "halton", "scramble": True}, optuna.samplers.QMCSampler),
    ({"kind": "tpe", "multivariate": False, "constant_liar": False, "n_startup_trials": 3}, optuna.samplers.TPESampler),
])
def test_each_kind_is_optunas_sampler_and_proposes_in_range(tmp_path, sampler, cls):
    space = load_space(_write(tmp_path, sampler=sampler, params={"fl.lr": LR, "fl.momentum": MOMENTUM}))
    built = make_sampler(space)
    assert isinstance(built.current, cls)
    study = optuna.create_study(sampler=built, direction="maximize")
    for _ in range(6):  # ask-and-tell, as Tune's OptunaSearch drives it
        trial = study.ask()
        lr, momentum = trial.suggest_float("fl.lr", 0.01, 0.1, log=True), trial.suggest_categorical("fl.momentum", [0.0, 0.9])
        assert 0.01 <= lr <= 0.1 and momentum in (0.0, 0.9)
        study.tell(trial, lr)


def test_grid_visits_every_config_once_and_survives_ask_and_tell(tmp_path):
    space = load_space(_write(tmp_path, sampler={"kind": "grid"}, trials=6, params={
        "fl.lr": {"type": "categorical", "choices": [0.01, 0.1]},
        "fl.local_epochs": {"type": "int", "low": 1, "high": 3}}))
    assert grid_size(space) == 6
    study = optuna.create_study(sampler=make_sampler(space), direction="maximize")
    seen = set()
    for _ in range(6):  # the last tell would call Study.stop() (RuntimeError outside optimize) in stock GridSampler
        trial = study.ask()
        seen.add((trial.suggest_categorical("fl.lr", [0.01, 0.1]), trial.suggest_int("fl.local_epochs", 1, 3)))
        study.tell(trial, 0.5)
    assert seen == {(lr, e) for lr in (0.01, 0.1) for e in (1, 2, 3)}


def test_schedulers_are_tunes(tmp_path):
    hyperband = make_scheduler(load_space(_write(tmp_path, scheduler={"kind": "hyperband", "brackets": 2,
                                                                      "grace_period": 1})), Ledger(tmp_path))
    assert isinstance(hyperband, StudyASHA) and hyperband.brackets == 2
    median = make_scheduler(load_space(_write(tmp_path, scheduler={"kind": "median", "grace_period": 2})), Ledger(tmp_path))
    assert isinstance(median, MedianStoppingRule)
    assert make_scheduler(load_space(_write(tmp_path, scheduler={"kind": "none"})), Ledger(tmp_path)) is None


MULTI = {"objectives": ["personal_val_acc", "personal_val_acc_p10"]}


@pytest.mark.parametrize("changes,needle", [
    ({"sampler": {"kind": "grid"}}, "sampler.kind: grid needs discrete params, but fl.lr is a continuous float"),
    ({"sampler": {"kind": "grid"}, "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.05, "step": 0.01}},
      "trials": 9}, "trials: 9 is more than the grid's 5 configs; allowed: 1..5 with sampler kind grid"),
    ({"sampler": {"kind": "cmaes"}, "params": {"fl.momentum": MOMENTUM}},
     "sampler.kind: cmaes searches int and float params, and every param here is categorical"),
    ({"sampler": {"kind": "cmaes"}, "scheduler": {"kind": "none"}, **MULTI},
     "sampler.kind: cmaes optimizes one objective"),
    ({"scheduler": {"kind": "hyperband"}, **MULTI},
     "scheduler.kind: 'hyperband' ranks trials by one metric; a multi-objective study needs scheduler: {kind: none}"),
    ({"scheduler": {"kind": "median"}, **MULTI}, "scheduler.kind: 'median' ranks trials by one metric"),
    ({"sampler": {"kind": "random", "multivariate": True}},
     "sampler.multivariate: an option of kind tpe, not of 'random'; kind random takes: no options"),
    ({"scheduler": {"kind": "median", "reduction_factor": 3}},
     "scheduler.reduction_factor: an option of kind asha, hyperband, not of 'median'"),
    ({"sampler": {"kind": "tpe", "group": True, "multivariate": False}}, "sampler.group: needs multivariate: true"),
    ({"sampler": {"kind": "bohb"}}, "sampler.kind: Input should be 'tpe', 'random', 'grid', 'gp', 'cmaes' or 'qmc'"),
    ({"scheduler": {"kind": "pbt"}}, "scheduler.kind: Input should be 'asha', 'hyperband', 'median' or 'none'"),
])
def test_invalid_combinations_are_one_line(tmp_path, changes, needle):
    with pytest.raises(ConfigError) as info:
        load_space(_write(tmp_path, **changes))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_refuses_an_invalid_combination_with_exit_2_before_ray(tmp_path):
    path = _write(tmp_path, sampler={"kind": "grid"})
    proc = subprocess.run([sys.executable, "-m", "autofl.cli", "search", "--space", str(path), "--dir",
                           str(tmp_path / "home")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "sampler.kind: grid needs discrete params" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "home" / "st").exists()


def test_multi_objective_takes_samplers_that_can_rank_fronts(tmp_path):
    for kind in ("tpe", "random", "gp", "qmc"):
        space = load_space(_write(tmp_path, sampler={"kind": kind}, scheduler={"kind": "none"}, **MULTI))
        assert space.multi_objective and make_sampler(space) is not None
    default = SearchSpace.model_validate({"study": "x"}).sampler
    assert default.kind == "random" and default.skip_repeats  # the benchmark's choice (docs/search-quality.md)


@pytest.mark.slow
def test_a_study_with_qmc_sampler_and_hyperband_runs(tmp_path):
    from test_search_e2e import run, space_file, trials_of

    path = space_file(tmp_path, "rm", trials=4, rounds=3)
    tree = yaml.safe_load(path.read_text())
    tree.update(sampler={"kind": "qmc", "scramble": True}, scheduler={"kind": "hyperband", "grace_period": 1,
                                                                       "reduction_factor": 2, "brackets": 2})
    path.write_text(yaml.safe_dump(tree))
    proc = run(["search", "--space", path, "--dir", tmp_path / "home"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = trials_of(tmp_path / "home", "rm")
    assert len(trials) == 4 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    assert all(t.system_attrs.get("fixed_params") or "fl.lr" in t.params for t in trials)
    assert len({t.params["fl.lr"] for t in trials}) == 4  # QMC: four different points


def test_a_study_keeps_the_sampler_defaults_it_was_created_with(tmp_path, monkeypatch):
    """A resumed study goes on with the sampler it started with, whatever today's default is."""
    from autofl.errors import StorageError
    from autofl.tuning.store.study import StudyFolder, create_study

    monkeypatch.delenv("AUTOFL_STORAGE", raising=False)
    path = _write(tmp_path)  # names no sampler
    study = create_study(tmp_path / "home", path, load_space(path), None)
    assert study.meta()["default_sampler"] == {"kind": "random", "skip_repeats": True}
    assert type(make_sampler(StudyFolder(study.root).space()).current) is optuna.samplers.RandomSampler
    # a study created before the defaults were recorded started with TPE, trained repeats, and goes on so
    (study.root / "study.json").write_text('{"runs": []}')
    legacy = StudyFolder(study.root).space()
    assert type(make_sampler(legacy).current) is optuna.samplers.TPESampler and not legacy.sampler.skip_repeats
    # what the space's own sampler section sets wins; only what it leaves unset is the recorded default
    (study.root / "space.yaml").write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()),
                                                          "sampler": {"kind": "qmc", "scramble": True}}))
    spec = StudyFolder(study.root).space().sampler
    assert spec.kind == "qmc" and spec.scramble and not spec.skip_repeats
    # TPE's options without a kind were valid when TPE was the default, and stay valid for that study
    (study.root / "space.yaml").write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()),
                                                          "sampler": {"n_startup_trials": 30}}))
    spec = StudyFolder(study.root).space().sampler
    assert spec.kind == "tpe" and spec.options()["n_startup_trials"] == 30
    # a damaged record is one line naming the field, not a traceback
    (study.root / "study.json").write_text('{"runs": [], "default_sampler": {"kind": "bohb"}}')
    with pytest.raises(StorageError, match="study.json: default_sampler must be"):
        StudyFolder(study.root).space()


def test_a_study_keeps_the_default_objective_it_was_created_with(tmp_path, monkeypatch):
    """A space that names no objective optimizes personal_val_acc_last3 since 2026-12-02; a study made
    before (study.json without the record) resumes with personal_val_acc, so its trials' values stay one
    metric; a space's own objective always wins."""
    from autofl.errors import StorageError
    from autofl.tuning.store.study import StudyFolder, create_study

    monkeypatch.delenv("AUTOFL_STORAGE", raising=False)
    path = _write(tmp_path)  # names no objective
    assert "objective" not in yaml.safe_load(path.read_text())
    study = create_study(tmp_path / "home", path, load_space(path), None)
    assert study.meta()["default_objective"] == "personal_val_acc_last3"
    assert StudyFolder(study.root).space().objective == "personal_val_acc_last3"
    assert StudyFolder(study.root).stored_space().objective == "personal_val_acc_last3"
    (study.root / "study.json").write_text('{"runs": []}')  # made before the default was recorded
    assert StudyFolder(study.root).space().objective == "personal_val_acc"
    (study.root / "space.yaml").write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()),
                                                          "objective": "personal_val_acc_p10_last3"}))
    assert StudyFolder(study.root).space().objective == "personal_val_acc_p10_last3"
    (study.root / "study.json").write_text('{"runs": [], "default_objective": "personal_test_acc"}')
    with pytest.raises(StorageError, match="study.json: default_objective must be one of"):
        StudyFolder(study.root).space()


def _objective(x: float, y: int) -> float:
    return -(x - 0.3) ** 2 - 0.01 * (y - 2) ** 2


def _proposals(study: "optuna.Study", space: SearchSpace, n: int, sampler=None) -> list[tuple]:
    """Ask-and-tell `n` trials on `study` with a fresh sampler of `space` (a new driver)."""
    study.sampler = sampler or make_sampler(space)
    out = []
    for _ in range(n):
        trial = study.ask()
        x, y = trial.suggest_float("fl.lr", 0.01, 0.1, log=True), trial.suggest_int("fl.local_epochs", 1, 3)
        study.tell(trial, _objective(x, y))
        out.append((x, y))
    return out


@pytest.mark.parametrize("sampler", [None, {"kind": "tpe", "n_startup_trials": 3}, {"kind": "gp", "n_startup_trials": 3},
                                     {"kind": "cmaes", "n_startup_trials": 2, "popsize": 3},
                                     {"kind": "qmc", "scramble": True}, {"kind": "grid"}])
def test_proposals_depend_on_the_study_not_on_the_driver_that_asks(tmp_path, sampler):
    """Issue 42: a study's proposed configs depend only on its space, seed and the results told so
    far. A driver that stops after 5 trials and a new one (a resume, an extension) that asks the
    rest propose what one driver asking all of them proposes, and a second resume the same again."""
    params = {"fl.lr": {"type": "categorical", "choices": [0.01, 0.02, 0.05, 0.1]},
              "fl.local_epochs": {"type": "int", "low": 1, "high": 3}} if sampler == {"kind": "grid"} else \
        {"fl.lr": LR, "fl.local_epochs": {"type": "int", "low": 1, "high": 3}}
    space = load_space(_write(tmp_path, seed=11, params=params, trials=8, **({"sampler": sampler} if sampler else {})))
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    grid = sampler == {"kind": "grid"}
    one = _proposals(optuna.create_study(study_name="one", storage=storage, direction="maximize"), space, 8)
    assert not grid or len(set(one)) == 8  # the grid visits each config once
    for name in ("resumed", "resumed-again"):
        split = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        assert _proposals(split, space, 5) + _proposals(split, space, 3) == one, name


@pytest.mark.parametrize("sampler", [None, {"kind": "tpe", "n_startup_trials": 3}])
def test_an_interrupted_placeholder_shifts_no_later_proposal(tmp_path, sampler):
    """A trial a killed driver left before its params were whole becomes an interrupted placeholder
    (autofl.tuning.store.ledger); the samplers that read only the told trials (random, TPE, GP) propose
    after it what an uninterrupted run proposes (CMA-ES, QMC and the grid count it in the study)."""
    space = load_space(_write(tmp_path, seed=11, params={"fl.lr": LR, "fl.local_epochs": {"type": "int", "low": 1,
                                                                                       "high": 3}},
                              **({"sampler": sampler} if sampler else {})))
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    one = _proposals(optuna.create_study(study_name="one", storage=storage, direction="maximize"), space, 8)
    split = optuna.create_study(study_name="split", storage=storage, direction="maximize")
    first = _proposals(split, space, 3)
    placeholder = split.ask()  # killed after its first param
    placeholder.suggest_float("fl.lr", 0.01, 0.1, log=True)
    placeholder.set_user_attr("interrupted", True)
    split.tell(placeholder, state=optuna.trial.TrialState.FAIL)
    assert first + _proposals(split, space, 5) == one


@pytest.mark.parametrize("sampler", [None, {"kind": "tpe", "n_startup_trials": 3},
                                     {"kind": "cmaes", "n_startup_trials": 2, "popsize": 3}, {"kind": "grid"}])
def test_a_trial_killed_while_its_params_were_set_is_finished_as_an_uninterrupted_run_would(tmp_path, sampler):
    """A driver killed after a trial's first param leaves it for the next driver to adopt
    (autofl.tuning.store.ledger.release): a new sampler sets the missing param to what one driver
    asking everything sets (each param drawn on its own has its own seed), and the trials after it
    are the uninterrupted run's too. (Not GP: Optuna's GPSampler counts the adopted trial, which
    holds the killed driver's draw, as a running trial to avoid, and may draw the rest anew.)"""
    grid = sampler == {"kind": "grid"}
    params = {"fl.lr": {"type": "categorical", "choices": [0.01, 0.02, 0.05, 0.1]},
              "fl.local_epochs": {"type": "int", "low": 1, "high": 3}} if grid else \
        {"fl.lr": LR, "fl.local_epochs": {"type": "int", "low": 1, "high": 3}}
    space = load_space(_write(tmp_path, seed=11, params=params, trials=8, **({"sampler": sampler} if sampler else {})))
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    one = _proposals(optuna.create_study(study_name="one", storage=storage, direction="maximize"), space, 8)
    split = optuna.create_study(study_name="split", storage=storage, direction="maximize")
    first = _proposals(split, space, 4)
    split.ask().suggest_float("fl.lr", 0.01, 0.1, log=True)  # the driver is killed here
    split.sampler = make_sampler(space)  # the next driver
    killed = split.trials[-1]
    ids = optuna.storages.RDBStorage(storage)  # what the ledger's adoption builds (public storage API)
    adopted = optuna.trial.Trial(split, ids.get_trial_id_from_study_id_trial_number(
        ids.get_study_id_from_name("split"), killed.number))
    x, y = adopted.suggest_float("fl.lr", 0.01, 0.1, log=True), adopted.suggest_int("fl.local_epochs", 1, 3)
    split.tell(adopted, _objective(x, y))
    assert first + [(x, y)] + _proposals(split, space, 3, split.sampler) == one


def test_a_restored_sampler_pickles_as_its_space_and_proposes_the_same(tmp_path):
    import pickle

    space = load_space(_write(tmp_path, seed=5, params={"fl.lr": LR, "fl.local_epochs": {"type": "int", "low": 1, "high": 3}}))
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    sampler = make_sampler(space)
    one = _proposals(optuna.create_study(study_name="a", storage=storage, direction="maximize"), space, 4, sampler)
    restored = pickle.loads(pickle.dumps(sampler))
    restored.reseed_rng()  # what a restored searcher used to do: draw afresh
    assert _proposals(optuna.create_study(study_name="b", storage=storage, direction="maximize"), space, 4,
                      restored) == one


# ---- issue 42: a space's size is counted, never listed, and bounded before any study exists ----
TINY_STEP = {"type": "float", "low": 0.0, "high": 0.5, "step": 1e-12}
WIDE_INT = {"type": "int", "low": 1, "high": 20_000}
WIDE_GRID = {"fl.batch_size": WIDE_INT, "fl.eval_every": WIDE_INT, "fl.rounds": WIDE_INT}


@pytest.mark.parametrize("kind", ["random", "tpe", "gp", "cmaes", "qmc", "grid"])
def test_a_tiny_float_step_is_refused_by_name_under_every_sampler(tmp_path, kind):
    with pytest.raises(ConfigError) as info:
        load_space(_write(tmp_path, sampler={"kind": kind}, params={"fl.momentum": TINY_STEP}))
    text = str(info.value)
    assert "params.fl.momentum: 500000000001 values from low=0 to high=0.5 in steps of 1e-12; allowed: at most " \
           "1000000 values per param" in text and "\n" not in text, text


def test_a_wide_grid_is_refused_by_its_size_naming_the_limit(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_space(_write(tmp_path, sampler={"kind": "grid"}, params=WIDE_GRID))
    assert "sampler.kind: grid over 8000000000000 configs (fl.batch_size alone takes 20000 values); allowed: at most 100000 " \
           "configs" in str(info.value)


def test_grid_sizes_are_counted_not_listed():
    from autofl.tuning.strategy.space import ParamSpec, grid_count, value_count

    huge = ParamSpec.model_construct(type="int", low=0, high=10**15, step=None, log=False, choices=None)
    assert value_count(huge) == grid_count(huge) == 10**15 + 1  # instant: a listed range would not fit in memory
    floats = ParamSpec(type="float", low=0.01, high=0.05, step=0.01)
    assert value_count(floats) == 5 and ParamSpec(type="float", low=0.0, high=1.0, step=0.6).model_dump()
    assert value_count(ParamSpec(type="float", low=0.0, high=1.0, step=0.6)) == 2  # 0, 0.6: never past high
    assert value_count(ParamSpec(type="float", low=0.0, high=0.3, step=0.1)) == 4  # 0.3/0.1 = 2.9999999999999996


LIMITED_PARSE = """
import sys, yaml
sys.path.insert(0, sys.argv[2])
from bounded_memory import cap_address_space
from autofl.errors import ConfigError
from autofl.tuning.strategy.space import parse_space
parse_space({"study": "warm", "base": {"fl": {"rounds": 4}}}, "warm-up")  # its lazy imports, before the cap
cap_address_space(1 << 30)  # 1 GiB more: a listed space of 10**12 values (or a 10**12-config grid) does not fit
try:
    parse_space(yaml.safe_load(sys.argv[1]), "space.yaml")
except ConfigError as err:
    print(err)
    sys.exit(2)
"""


@pytest.mark.parametrize("sampler,params", [
    ("random", {"fl.momentum": TINY_STEP}),
    ("grid", {"fl.momentum": TINY_STEP}),
    ("grid", WIDE_GRID),
])
def test_a_huge_space_is_refused_within_a_memory_limit(tmp_path, sampler, params):
    space = {"study": "st", "base": {"fl": {"rounds": 4}}, "sampler": {"kind": sampler}, "params": params}
    proc = subprocess.run([sys.executable, "-c", LIMITED_PARSE, yaml.safe_dump(space), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "allowed: at most" in proc.stdout, (proc.returncode, proc.stderr[-2000:])

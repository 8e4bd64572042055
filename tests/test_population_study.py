"""Population trials in a study (issue 37, item 3): a Tune trial trains a cohort of configs that
differ only in fusible values; every member is its own Optuna trial, reported, judged by ASHA and
closed on its own (autofl/tuning/strategy/cohorts.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from autofl.engine.simulation import Simulation
from autofl.experiment import build_experiment
from autofl.methods.registry import get_method_class
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.strategy.cohorts import cohort_of, fixed_params, member_id, member_index
from autofl.tuning.strategy.space import SearchSpace, experiment_dict
from autofl.tuning.tune.cohort_trainable import CohortTrainable
from autofl.tuning.tune.scheduler import StudyASHA
from autofl.tuning.tune.searcher import StudySearcher


def define_space(trial) -> None:
    """A fusible value (fl.lr) and one that is not (model.head_layers); module level: it pickles."""
    trial.suggest_float("fl.lr", 0.001, 0.1, log=True)
    trial.suggest_int("model.head_layers", 1, 2)


def study_root(tmp_path: Path) -> Path:
    root = tmp_path / "s"
    root.mkdir(exist_ok=True)
    (root / "space.yaml").write_text("study: s\n")
    return root


def searcher(root: Path, method: str = "fedprox", budget: int = 6, population: int = 4) -> StudySearcher:
    return StudySearcher(Ledger(root), define_space, optuna.samplers.TPESampler(seed=0), metric="acc", mode="max",
                         max_t=4, run_name="run-1", budget=budget, skip_repeats=True, population=population,
                         base={"method": {"name": method}})


def test_a_cohort_shares_its_non_fusible_values_and_each_member_is_a_trial_of_the_budget(tmp_path):
    root = study_root(tmp_path)
    s = searcher(root, budget=6)
    first, second = s.suggest("a"), s.suggest("b")
    assert s.suggest("c") == Searcher.FINISHED  # 4 + 2 members: the run's budget of 6 trials
    assert [len(c["members"]) for c in (first, second)] == [4, 2]
    for cohort, tune_id in ((first, "a"), (second, "b")):
        heads = {m["params"]["model.head_layers"] for m in cohort["members"]}
        assert len(heads) == 1  # not fusible: one value per cohort
        assert [m["id"] for m in cohort["members"]] == [member_id(tune_id, i) for i in range(len(cohort["members"]))]
        assert all(cohort_of(m["id"]) == tune_id for m in cohort["members"])
    lrs = [m["params"]["fl.lr"] for c in (first, second) for m in c["members"]]
    assert len(set(lrs)) == 6  # the sampler proposed each member's fusible value
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}").get_trials()
    assert [t.number for t in trials] == list(range(6))
    assert [t.user_attrs["tune_trial_id"] for t in trials] == [m["id"] for c in (first, second) for m in c["members"]]


def test_a_method_that_cannot_share_its_training_forms_cohorts_of_one(tmp_path, monkeypatch):
    monkeypatch.setattr(get_method_class("fedproto"), "population_ready", False)  # as a plugin that does not say
    assert fixed_params({"fl.lr": 0.01}, {"method": {"name": "fedproto"}}) is None  # not population_ready
    assert fixed_params({"fl.lr": 0.01, "fedprox:method.mu": 0.1, "model.head_layers": 2},
                        {"method": {"name": "fedprox"}}) == {"model.head_layers": 2}
    s = searcher(study_root(tmp_path), method="fedproto", budget=3)
    assert [len(s.suggest(t)["members"]) for t in "abc"] == [1, 1, 1]


def test_a_killed_cohort_comes_back_whole_with_its_numbers_and_params(tmp_path):
    root = study_root(tmp_path)
    before = searcher(root, budget=3, population=3).suggest("a")
    assert Ledger(root).release_orphans() == 3  # its driver was killed: the next run's asks adopt them
    after = searcher(root, budget=3, population=3).suggest("z")
    assert [(m["number"], m["params"]) for m in after["members"]] == [
        (m["number"], m["params"]) for m in before["members"]
    ]
    assert [m["id"] for m in after["members"]] == [member_id("z", i) for i in range(3)]


def study_asha(root: Path) -> StudyASHA:
    """ASHA over 4 rounds, rungs at 1 and 2 (grace 1, halving), maximizing `acc`."""
    asha = StudyASHA(Ledger(root), time_attr="round", max_t=4, grace_period=1, reduction_factor=2)
    asha.set_search_properties(metric="acc", mode="max", config={})
    return asha


def _result(cohort: dict, rnd: int, values: list[float]) -> dict:
    members = [{"id": m["id"], "number": m["number"], "acc": v} for m, v in zip(cohort["members"], values)]
    return {"round": rnd, "acc": max(values), "members": members}


def test_asha_judges_each_member_and_a_pruned_member_is_closed_pruned_at_its_rung(tmp_path):
    root = study_root(tmp_path)
    s = searcher(root, budget=4, population=4)
    cohort = s.suggest("a")
    asha = study_asha(root)
    trial = SimpleNamespace(trial_id="a", config=cohort)
    asha.on_trial_add(None, trial)
    # round 1 is a rung: each member against the others there (Tune's order: the scheduler, then the searcher)
    first = _result(cohort, 1, [0.9, 0.1, 0.8, 0.2])
    assert asha.on_trial_result(None, trial, first) == TrialScheduler.CONTINUE
    s.on_trial_result("a", first)
    ledger = Ledger(root)
    numbers = [m["number"] for m in cohort["members"]]
    assert ledger.finished_numbers(numbers) == {numbers[1], numbers[3]}
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}")
    pruned = study.trials[numbers[1]]
    assert pruned.state == TrialState.PRUNED and pruned.intermediate_values == {1: 0.1}
    assert study.trials[numbers[0]].state == TrialState.RUNNING and study.trials[numbers[0]].intermediate_values == {1: 0.9}
    # the worker drops the pruned members: the next results hold the other two; at max_t the cohort ends
    alive = {"members": [cohort["members"][0], cohort["members"][2]]}
    second = _result(alive, 2, [0.95, 0.5])
    assert asha.on_trial_result(None, trial, second) == TrialScheduler.CONTINUE
    s.on_trial_result("a", second)
    assert ledger.finished_numbers(numbers) == {numbers[1], numbers[2], numbers[3]}  # rung 2 keeps 1 of 2
    last = _result({"members": [cohort["members"][0]]}, 4, [0.97])
    assert asha.on_trial_result(None, trial, last) == TrialScheduler.STOP  # its only member reached max_t
    s.on_trial_complete("a", last)
    states = [t.state for t in optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}").trials]
    assert states == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED, TrialState.PRUNED]


def test_every_member_pruned_stops_the_cohort_trial(tmp_path):
    root = study_root(tmp_path)
    s = searcher(root, budget=6, population=2)
    earlier = s.suggest("a")
    asha = study_asha(root)
    first = SimpleNamespace(trial_id="a", config=earlier)
    asha.on_trial_add(None, first)
    assert asha.on_trial_result(None, first, _result(earlier, 1, [0.9, 0.8])) == TrialScheduler.CONTINUE
    later = s.suggest("b")
    second = SimpleNamespace(trial_id="b", config=later)
    asha.on_trial_add(None, second)
    assert asha.on_trial_result(None, second, _result(later, 1, [0.1, 0.2])) == TrialScheduler.STOP


def test_the_cohort_trainable_trains_each_member_as_its_run_alone_and_drops_pruned_members(tmp_path):
    """Each member's round metrics equal its config trained alone (a search's sealed test), and a member
    the study has finished is not trained again."""
    root = study_root(tmp_path)
    base = {"data": {"dataset": "digits", "num_clients": 4, "partition": {"kind": "pathological",
                                                                           "classes_per_client": 3}},
            "fl": {"rounds": 3}, "method": {"name": "fedprox"}, "runtime": {"dtype": "float64"}}
    cohort = {"members": [{"id": member_id("a", i), "number": i, "params": {"fl.lr": lr, "fedprox:method.mu": mu}}
                          for i, (lr, mu) in enumerate([(0.05, 0.1), (0.01, 0.5), (0.1, 0.01)])]}
    ledger = Ledger(root)
    ledger.study(create_directions=["maximize"])
    for _ in range(3):  # the members' trials, as the searcher made them
        ledger.study().ask()
    trainable = CohortTrainable.__new__(CohortTrainable)  # what tune.with_parameters hands to setup
    trainable.setup(cohort, study_root=str(root), base=base, seal_test=True, objective="personal_val_acc", mode="max")
    first = trainable.step()
    ledger.study().tell(1, state=TrialState.PRUNED)  # ASHA stopped member 1 at round 1
    second = trainable.step()
    trainable.save_checkpoint(str(tmp_path))  # a worker killed now: a new one resumes from it
    resumed = CohortTrainable.__new__(CohortTrainable)
    resumed.setup(cohort, study_root=str(root), base=base, seal_test=True, objective="personal_val_acc", mode="max")
    resumed.load_checkpoint(str(tmp_path))
    rest = [second, resumed.step()]
    assert [m["id"] for m in first["members"]] == [member_id("a", i) for i in range(3)]
    assert [[m["id"] for m in r["members"]] for r in rest] == [[member_id("a", 0), member_id("a", 2)]] * 2
    assert rest[-1]["done"]
    keys = ("round", "train_loss", "personal_val_acc", "global_val_acc")
    for i, member in enumerate(cohort["members"]):
        exp = build_experiment(experiment_dict(base, member["params"]))
        alone = list(Simulation(exp, get_method_class("fedprox"), sealed_test=True).run())
        got = [next(m for m in r["members"] if m["id"] == member["id"]) for r in [first, *rest]
               if any(m["id"] == member["id"] for m in r["members"])]
        assert [{k: m[k] for k in keys} for m in got] == [{k: m[k] for k in keys} for m in alone[: len(got)]]
    assert len([r for r in [first, *rest] if any(m["id"] == member_id("a", 1) for m in r["members"])]) == 1


def test_a_median_scheduler_is_refused_with_a_population():
    with pytest.raises(ValueError, match="scheduler.kind: median stops whole trials"):
        SearchSpace(**yaml.safe_load("""
study: s
base: {method: {name: fedprox}}
params: {fl.lr: {type: float, low: 0.001, high: 0.1}}
scheduler: {kind: median}
resources: {population: 4}
"""))


@pytest.mark.slow
def test_a_population_study_records_each_member_as_its_config_trained_alone(tmp_path):
    """`autofl search` with resources.population 3: Tune trials of 3 configs, every trial's per-round
    values those of its recorded config trained alone, ASHA pruning members on their own. One Tune trial
    at a time: the first cohort is refilled as its members leave (FDCL, every client every round), so
    members that joined later train beside those further on, and still give their configs' runs alone."""
    from test_search_e2e import run, space_file, trials_of

    space = space_file(tmp_path, "pop", trials=6, rounds=4)
    tree = yaml.safe_load(space.read_text())
    tree["resources"] = {"cpu": 1, "population": 3, "max_concurrent": 1}
    space.write_text(yaml.safe_dump(tree))
    proc = run(["search", "--space", space, "--dir", tmp_path / "home"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "started (population of 3)" in proc.stdout and "6/6 trials finished" in proc.stdout
    trials = trials_of(tmp_path / "home", "pop")
    assert len(trials) == 6 and {t.state.name for t in trials} == {"COMPLETE", "PRUNED"}
    ids = [t.user_attrs["tune_trial_id"] for t in trials]
    assert len({cohort_of(i) for i in ids}) < 2 or max(map(member_index, ids)) >= 3  # a cohort was refilled
    assert any(t.user_attrs.get("cohort_member") for t in trials)  # a member that joined a cohort later
    for t in trials:
        exp = build_experiment(t.user_attrs["config"])
        alone = [m["personal_val_acc_last3"]  # the default objective's values
                 for m in Simulation(exp, get_method_class("fdcl"), sealed_test=True).run()]
        assert [t.intermediate_values[r] for r in sorted(t.intermediate_values)] == alone[: len(t.intermediate_values)]
        assert t.state.name == "PRUNED" or len(t.intermediate_values) == 4


def test_population_auto_measures_the_width_and_a_resumed_study_keeps_the_first_runs(monkeypatch):
    from autofl.tuning.tune.population_width import resolve_auto_population

    base = {"data": {"dataset": "digits", "num_clients": 4}, "fl": {"rounds": 3}, "method": {"name": "fedprox"}}
    width, line = resolve_auto_population(build_experiment(base), trials=8, slots=2, threads=1)
    assert 1 <= width <= 4 and line.startswith(f"resources.population: auto = {width}: config-rounds/s")
    assert "at most 4 (8 trials over 2 slot(s))" in line
    assert width == 1 or "population steps: eager (runtime.compile=auto: eager" in line  # 3 rounds: too few steps
    monkeypatch.setattr(get_method_class("fedproto"), "population_ready", False)  # as a plugin that does not say
    proto = {**base, "method": {"name": "fedproto"}}
    assert resolve_auto_population(build_experiment(proto), trials=8, slots=2, threads=1) == (
        1, "resources.population: auto = 1: method fedproto trains configs one by one")
    space = SearchSpace(study="s", base=base, params={"fl.lr": {"type": "float", "low": 0.001, "high": 0.1}},
                        resources={"population": "auto"})
    resolved = space.resolve_resources(recorded_population=5)  # measured by the study's first run: kept
    assert resolved.resources.population_width == 5 and "as this study's first run measured" in resolved.resources.auto_line
    with pytest.raises(ValueError, match="resources.population"):
        SearchSpace(study="s", base=base, params={"fl.lr": {"type": "float", "low": 0.001, "high": 0.1}},
                    resources={"population": 0})


def test_a_cohort_whose_members_the_study_finished_ends_without_training(tmp_path):
    """A driver killed after it closed every member (Tune's snapshot still lists the cohort): the restarted
    cohort trains no round and ends at once, with its objective present, as Tune checks."""
    root = study_root(tmp_path)
    ledger = Ledger(root)
    ledger.study(create_directions=["maximize"])
    cohort = {"members": [{"id": member_id("a", i), "number": i, "params": {"fl.lr": 0.01 * (i + 1)}} for i in range(2)]}
    for _ in cohort["members"]:
        trial = ledger.study().ask()
        ledger.study().tell(trial.number, state=TrialState.PRUNED)
    trainable = CohortTrainable.__new__(CohortTrainable)
    trainable.setup(cohort, study_root=str(root), base={"data": {"num_clients": 4}, "fl": {"rounds": 3},
                                                        "method": {"name": "fedavg"}}, seal_test=True)
    result = trainable.step()
    # the objective Tune checks for: here the default, personal_val_acc_last3
    assert result["done"] and result["members"] == [] and result["round"] == 0 and "personal_val_acc_last3" in result


def test_auto_widths_double_up_to_the_cap_and_stop_where_a_doubling_gains_too_little(monkeypatch):
    """The probe's decisions on fixed rates (config-rounds/s by width): no real timing."""
    import autofl.tuning.tune.population_width as pw

    base = build_experiment({"data": {"dataset": "digits", "num_clients": 4}, "method": {"name": "fedprox"}})
    tried: list[int] = []

    def rates(table):
        def measure(exp, width, raw, device):
            tried.append(width)
            return table[width]
        return measure

    monkeypatch.setattr(pw, "config_rounds_per_s", rates({1: 1.0, 2: 2.0, 4: 4.0, 6: 6.0}))
    assert pw.resolve_auto_population(base, trials=12, slots=2, threads=1)[0] == 6  # cap 6: 1, 2, 4, then 6
    assert tried == [1, 2, 4, 6]
    tried.clear()
    monkeypatch.setattr(pw, "config_rounds_per_s", rates({1: 1.0, 2: 1.9, 4: 2.0, 8: 9.0}))
    width, line = pw.resolve_auto_population(base, trials=16, slots=2, threads=1)
    assert (width, tried) == (2, [1, 2, 4])  # 4 gains 5% over 2: no further doubling, and 2 stays chosen
    assert "auto = 2:" in line and "{1: 1.00, 2: 1.90, 4: 2.00}" in line
    tried.clear()
    monkeypatch.setattr(pw, "config_rounds_per_s", rates({1: 1.0, 2: 2.0, 4: 2.4, 8: 2.6}))
    assert pw.resolve_auto_population(base, trials=16, slots=2, threads=1)[0] == 4  # 8 gains 8% over 4
    assert tried == [1, 2, 4, 8]


def test_a_grid_sampler_is_refused_with_a_population():
    with pytest.raises(ValueError, match="sampler.kind: grid hands each trial one whole grid point"):
        SearchSpace(**yaml.safe_load("""
study: s
base: {method: {name: fedprox}}
params: {fl.lr: {type: categorical, choices: [0.01, 0.1]}}
sampler: {kind: grid}
trials: 2
resources: {population: 2}
"""))


def test_a_fresh_driver_does_not_judge_a_member_an_earlier_driver_closed(tmp_path):
    """A worker that could not read the storage trains a pruned member on; a restarted driver's scheduler
    sees that member's results, recognizes it closed, and keeps it out of every rung."""
    root = study_root(tmp_path)
    cohort = searcher(root, budget=2, population=2).suggest("a")
    first, second = cohort["members"]
    Ledger(root).study().tell(second["number"], state=TrialState.PRUNED)  # by the earlier driver
    asha = study_asha(root)
    trial = SimpleNamespace(trial_id="a", config=cohort)
    asha.on_trial_add(None, trial)
    assert asha.on_trial_result(None, trial, _result(cohort, 1, [0.5, 0.9])) == TrialScheduler.CONTINUE
    assert asha.rungs[1] == {first["id"]: 0.5}


def test_auto_caps_the_width_by_the_trials_the_run_trains(monkeypatch):
    """`autofl search --trials 16` on a space of 2 trials: the probe's cap counts the 16."""
    import autofl.tuning.tune.population_width as pw

    seen = []
    monkeypatch.setattr(pw, "resolve_auto_population",
                        lambda exp, trials, slots, threads, device: (seen.append(trials) or 1, "line"))
    space = SearchSpace(study="s", base={"method": {"name": "fedprox"}}, trials=2,
                        params={"fl.lr": {"type": "float", "low": 0.001, "high": 0.1}}, resources={"population": "auto"})
    space.resolve_resources(trials=16)
    assert seen == [16] and space.resources.population_width == 1


def refill_searcher(root: Path, budget: int, population: int = 2) -> StudySearcher:
    """A searcher of refilled cohorts: fedprox's step is the same at every round, every client trains
    every round (the defaults), so a cohort gets a new member for each one that leaves."""
    return StudySearcher(Ledger(root), define_space, optuna.samplers.TPESampler(seed=0), metric="acc", mode="max",
                         max_t=4, run_name="run-1", budget=budget, skip_repeats=True, population=population,
                         base={"method": {"name": "fedprox"}}, refill=True)


def test_a_refilled_cohort_gets_a_new_member_for_each_that_leaves_while_the_budget_lasts(tmp_path):
    root = study_root(tmp_path)
    s = refill_searcher(root, budget=4)
    cohort = s.suggest("a")
    assert cohort["refill"] is True and cohort["width"] == 2
    assert [m["id"] for m in cohort["members"]] == ["a:m0", "a:m1"]
    asha = study_asha(root)
    trial = SimpleNamespace(trial_id="a", config=cohort)
    asha.on_trial_add(None, trial)
    # Tune's order: the scheduler (which prunes member 1 at its rung), then the searcher (which refills)
    first = {**_result(cohort, 1, [0.9, 0.1]), "training_iteration": 1}
    assert asha.on_trial_result(None, trial, first) == TrialScheduler.CONTINUE
    s.on_trial_result("a", first)
    ledger = Ledger(root)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}")
    joined = study.trials[2]
    assert joined.user_attrs["tune_trial_id"] == "a:m2" and joined.state == TrialState.RUNNING
    heads = {t.params["model.head_layers"] for t in study.trials}
    assert len(heads) == 1  # the new member shares the cohort's non-fusible values
    assert ledger.joining_members("a", 0) == []  # it joins after the cohort's first iteration
    [entry] = ledger.joining_members("a", 1)
    assert (entry["id"], entry["number"]) == ("a:m2", 2) and entry["params"]["fl.lr"] == joined.params["fl.lr"]
    assert ledger.joining_members("b", 1) == []
    # member 0 trains every round (max_t 4) while member 2 goes on: member 0 is closed COMPLETE there and
    # then, and the last trial of the budget takes its place
    going = {"members": [cohort["members"][0], entry]}
    last = {**_result(going, 4, [0.97, 0.5]), "training_iteration": 4}
    last["members"][1]["round"] = 3
    assert asha.on_trial_result(None, trial, last) == TrialScheduler.CONTINUE
    s.on_trial_result("a", last)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING,
                                               TrialState.RUNNING]
    assert study.trials[0].value == 0.97 and study.trials[3].user_attrs["tune_trial_id"] == "a:m3"
    assert [m["id"] for m in ledger.joining_members("a", 4)] == ["a:m2", "a:m3"]
    assert s.suggest("b") == Searcher.FINISHED  # the budget of 4 is asked: no more cohorts, no more members
    # the searcher's state (Tune's snapshot) carries the refilled cohorts
    restored = refill_searcher(root, budget=4)
    restored.set_state(s.get_state())
    assert restored.get_state() == s.get_state()


def define_lr(trial) -> None:
    trial.suggest_float("fl.lr", 0.001, 0.1, log=True)


def test_a_cohort_of_a_method_whose_step_changes_with_the_round_is_not_refilled(tmp_path):
    root = study_root(tmp_path)
    s = StudySearcher(Ledger(root), define_lr, optuna.samplers.TPESampler(seed=0), metric="acc", mode="max",
                      max_t=4, run_name="run-1", budget=4, population=2, base={"method": {"name": "fedproto"}},
                      refill=True)
    assert "refill" not in s.suggest("a")  # FedProto has no prototype term before its first server update
    (tmp_path / "p").mkdir()
    partial = StudySearcher(Ledger(study_root(tmp_path / "p")), define_lr, optuna.samplers.TPESampler(seed=0),
                            metric="acc", mode="max", max_t=4, run_name="run-1", budget=4, population=2,
                            base={"method": {"name": "fedprox"}, "fl": {"participation": 0.5}}, refill=True)
    assert "refill" not in partial.suggest("a")  # another round samples other clients: no shared step


class Worker(CohortTrainable):
    """A cohort's worker outside Tune, with the Tune trial id and iteration Tune would give it."""

    trial_id = "a"
    iteration = 0


def test_a_refilled_cohorts_worker_adds_each_member_after_its_iteration_and_keeps_it_across_a_restore(tmp_path):
    root = study_root(tmp_path)
    base = {"data": {"dataset": "digits", "num_clients": 4, "partition": {"kind": "pathological",
                                                                           "classes_per_client": 3}},
            "fl": {"rounds": 3}, "method": {"name": "fedprox"}, "runtime": {"dtype": "float64"}}
    params = [{"fl.lr": lr, "fedprox:method.mu": mu} for lr, mu in [(0.05, 0.1), (0.01, 0.5), (0.1, 0.01)]]
    cohort = {"members": [{"id": member_id("a", i), "number": i, "params": params[i]} for i in range(2)],
              "refill": True}
    ledger = Ledger(root)
    ledger.study(create_directions=["maximize"])
    for i in range(3):  # the members' trials, as the searcher made them; the third joins after iteration 1
        ledger.study().ask().set_user_attr("tune_trial_id", member_id("a", i))
    worker = Worker.__new__(Worker)
    worker.setup(cohort, study_root=str(root), base=base, seal_test=True, objective="personal_val_acc", mode="max")
    results = [worker.step()]
    ledger.study().tell(1, state=TrialState.PRUNED)  # ASHA stopped member 1 at round 1 ...
    ledger.assign_member(2, params[2], joins_at=1)  # ... and the searcher asked member 2 in its place
    worker.iteration = 1
    results.append(worker.step())
    worker.save_checkpoint(str(tmp_path))  # a worker killed now: a new one resumes from it
    resumed = Worker.__new__(Worker)
    resumed.setup(cohort, study_root=str(root), base=base, seal_test=True, objective="personal_val_acc", mode="max")
    resumed.load_checkpoint(str(tmp_path))
    resumed.iteration = 2
    results += [resumed.step(), resumed.step()]
    assert [[(m["id"], m["round"]) for m in r["members"]] for r in results] == [
        [("a:m0", 1), ("a:m1", 1)], [("a:m0", 2), ("a:m2", 1)], [("a:m0", 3), ("a:m2", 2)], [("a:m2", 3)]]
    assert [r["done"] for r in results] == [False, False, False, True]
    keys = ("round", "train_loss", "personal_val_acc")
    for i in (0, 2):  # each member's rounds are its config's trained alone, whenever it joined
        exp = build_experiment(experiment_dict(base, params[i]))
        alone = list(Simulation(exp, get_method_class("fedprox"), sealed_test=True).run())
        got = [m for r in results for m in r["members"] if m["id"] == member_id("a", i)]
        assert [{k: m[k] for k in keys} for m in got] == [{k: m[k] for k in keys} for m in alone]


def test_a_resumed_driver_refills_a_cohort_at_the_iterations_the_first_did(tmp_path):
    """A driver killed after refilling a cohort twice, resumed from a snapshot taken before the second: its
    cohort trains the earlier iterations again, and the resumed searcher asks (adopting the orphan the first
    driver asked) at the iteration the first driver did, never sooner, with a member id the cohort never used."""
    root = study_root(tmp_path)
    first = refill_searcher(root, budget=5)
    cohort = first.suggest("a")
    asha = study_asha(root)
    trial = SimpleNamespace(trial_id="a", config=cohort)
    asha.on_trial_add(None, trial)

    def step(searcher: StudySearcher, scheduler: StudyASHA, members: list[dict], values: list[float],
             rounds: list[int], iteration: int) -> str:
        result = {**_result({"members": members}, max(rounds), values), "training_iteration": iteration}
        for entry, rnd in zip(result["members"], rounds):
            entry["round"] = rnd
        decision = scheduler.on_trial_result(None, trial, result)
        searcher.on_trial_result("a", result)
        return decision

    m0, m1 = cohort["members"]
    assert step(first, asha, [m0, m1], [0.9, 0.1], [1, 1], 1) == TrialScheduler.CONTINUE  # m1 pruned at rung 1
    snapshot = json.loads(json.dumps(first.get_state()))  # Tune's last snapshot of the searcher (a JSON file)
    [m2] = Ledger(root).joining_members("a", 1)
    assert m2["id"] == "a:m2"
    # m0 and m2 reach rung 2 (m2 at its round 1: judged at rung 1, kept); m2 then falls at rung 2, m3 is asked
    assert step(first, asha, [m0, m2], [0.95, 0.99], [2, 1], 2) == TrialScheduler.CONTINUE
    assert step(first, asha, [m0, m2], [0.96, 0.2], [3, 2], 3) == TrialScheduler.CONTINUE
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}")
    assert [t.state for t in study.trials] == [TrialState.RUNNING, TrialState.PRUNED, TrialState.PRUNED,
                                               TrialState.RUNNING]
    assert study.trials[3].user_attrs["cohort_member"]["joins_at"] == 3
    # killed; the resumed driver restores the snapshot: m3 (asked after it) is released as an orphan
    resumed = refill_searcher(root, budget=5)
    resumed.set_state(snapshot)
    assert Ledger(root).release_unknown_orphans("run-1", set(snapshot["trials"])) == 1
    again = study_asha(root)
    again.on_trial_add(None, trial)
    # the cohort trains iterations 1-3 again from its checkpoint at 0 (the worker drops m1 and m2 at once:
    # the study finished them); no ask before iteration 3, where the first driver asked m3
    assert step(resumed, again, [m0], [0.9], [1], 1) == TrialScheduler.CONTINUE
    assert step(resumed, again, [m0], [0.95], [2], 2) == TrialScheduler.CONTINUE
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}").trials) == 4
    assert Ledger(root).joining_members("a", 3) == []  # m3 is an orphan until the ask at iteration 3
    step(resumed, again, [m0], [0.96], [3], 3)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}")
    assert len(study.trials) == 4  # no new trial: the orphan m3 adopted
    [joined] = Ledger(root).joining_members("a", 3)
    assert joined["number"] == 3 and study.trials[3].user_attrs["cohort_member"]["joins_at"] == 3
    ids = [t.user_attrs["tune_trial_id"] for t in study.trials]
    assert len(set(ids)) == 4 and joined["id"] not in ("a:m0", "a:m1", "a:m2")  # never an id the cohort used

"""Constraints on reported metrics and warm-starting a study from another (issue 40, items 4 and 5).

Studies are built with Optuna directly (no Ray), as tests/test_hostile_input.py does; one small
end-to-end search checks that warm-started trials are neither trained again nor counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution

from autofl.errors import AutoFLError, ConfigError
from tests.test_hostile_input import cli

LR = {"type": "float", "low": 0.01, "high": 0.1}
BASE = {"data": {"num_clients": 3}, "fl": {"rounds": 2}}


def space_dict(name: str, **extra: Any) -> dict[str, Any]:
    # the trials these tests make report personal_val_acc as their value: the objective is named
    return {"study": name, "trials": 3, "base": BASE, "params": {"fl.lr": LR}, "objective": "personal_val_acc", **extra}


def parse(**extra: Any):
    from autofl.tuning.strategy.space import parse_space

    return parse_space(space_dict("s", **extra), "s.yaml")


def make_study(tmp_path: Path, name: str, trials: list[dict[str, Any]], **extra: Any) -> Path:
    """A study folder under tmp_path/home whose SQLite storage holds `trials` (each: lr, state,
    value, attrs, constraints), every one with the config a search records for it."""
    from autofl.tuning.store import study as st
    from autofl.tuning.strategy.space import load_space

    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space_dict(name, **extra)))
    study = st.create_study(tmp_path / "home", path, load_space(path), None)
    ot = optuna.create_study(study_name=name, storage=study.storage_url(), direction="maximize")
    for t in trials:
        params = {"fl.lr": t["lr"]}
        state = t.get("state", "COMPLETE")
        ot.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState[state],
                params=params,
                distributions={"fl.lr": FloatDistribution(0.01, 0.1)},
                value=t["value"] if state == "COMPLETE" else None,
                intermediate_values={1: t["value"] / 2, 2: t["value"]} if state == "COMPLETE" else {1: t["value"]},
                user_attrs={
                    "round": 2 if state == "COMPLETE" else 1,
                    "personal_val_acc": t["value"],
                    **t.get("attrs", {}),
                    st.CONFIG_ATTR: st.resolved_config(study.space(), params),
                },
                constraints=t.get("constraints"),
            )
        )
    return study.root


# ----- constraints: parsing -------------------------------------------------------------------------


def test_constraints_parse_into_metric_op_bound():
    space = parse(constraints=["personal_val_acc_p10 >= 0.6", "train_loss<=2"], sampler={"kind": "tpe"})
    assert [(c.metric, c.op, c.bound) for c in space.parsed_constraints] == [
        ("personal_val_acc_p10", ">=", 0.6),
        ("train_loss", "<=", 2.0),
    ]


@pytest.mark.parametrize(
    ("constraints", "sampler", "message"),
    [
        (
            ["personal_val_acc >= 0.5", "bogus <= 1"],
            "tpe",
            "s.yaml: constraints[1]: 'bogus' is not a reported metric; allowed: {allowed}",
        ),
        (
            ["personal_test_acc >= 0.5"],
            "gp",
            "s.yaml: constraints[0]: 'personal_test_acc' is a test metric (reported, never optimized or "
            "constrained); allowed: {allowed}",
        ),
        (
            ["personal_val_acc > 0.5"],
            "tpe",
            "s.yaml: constraints[0]: 'personal_val_acc > 0.5' is not a constraint; allowed: '<metric> >= "
            "<number>' or '<metric> <= <number>', with a metric among {allowed}",
        ),
        (
            ["train_loss <= inf"],
            "tpe",
            "s.yaml: constraints[0]: bound 'inf' is not a finite number; allowed: '<metric> >= <number>' or "
            "'<metric> <= <number>'",
        ),
        (
            ["train_loss <= 2"],
            "random",
            "s.yaml: constraints: sampler kind random ignores constraints; allowed: sampler kind tpe or gp "
            "(Optuna's samplers that model them), or no constraints",
        ),
    ],
)
def test_a_bad_constraint_is_one_line_naming_it(constraints, sampler, message):
    from autofl.tuning.strategy.constraints import constraint_metrics

    with pytest.raises(ConfigError) as err:
        parse(constraints=constraints, sampler={"kind": sampler})
    assert str(err.value) == message.replace("{allowed}", ", ".join(constraint_metrics()))


def test_the_constrainable_metrics_are_the_reported_ones_but_test_metrics_round_and_node():
    from autofl.tuning.strategy.constraints import constraint_metrics
    from autofl.tuning.strategy.objectives import REPORTED_KEYS

    allowed = constraint_metrics()
    assert {"personal_val_acc", "personal_val_acc_std", "personal_val_acc_p10", "global_val_acc", "train_loss"} <= set(
        allowed
    )
    assert set(allowed) <= set(REPORTED_KEYS) and not {"round", "node_id"} & set(allowed)
    assert not [m for m in allowed if "test" in m.split("_")]


@pytest.mark.parametrize("kind", ["grid", "cmaes", "qmc"])
def test_every_sampler_without_constraint_support_is_refused(kind):
    extra: dict[str, Any] = {"params": {"fl.lr": {**LR, "step": 0.01}}} if kind == "grid" else {}
    with pytest.raises(ConfigError, match=f"constraints: sampler kind {kind} ignores constraints"):
        parse(constraints=["train_loss <= 2"], sampler={"kind": kind}, **extra)


def test_a_global_metric_constraint_needs_a_method_with_a_global_model():
    with pytest.raises(ConfigError, match=r"constraints\[0\]: method fedper has no global model"):
        parse(
            constraints=["global_val_acc >= 0.5"],
            sampler={"kind": "tpe"},
            base={**BASE, "method": {"name": "fedper"}},
        )


def test_a_cli_search_with_a_bad_constraint_exits_2_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(space_dict("bad", constraints=["personal_test_acc >= 0.5"], sampler={"kind": "tpe"})))
    code, _, err = cli(capsys, "search", "--space", path, "--dir", tmp_path / "home")
    assert code == 2 and len(err.splitlines()) == 1 and "constraints[0]: 'personal_test_acc' is a test metric" in err
    assert not (tmp_path / "home").exists()


# ----- constraints: values --------------------------------------------------------------------------


def test_constraint_values_are_value_minus_bound_and_bound_minus_value():
    from autofl.tuning.strategy.constraints import MISSING_VIOLATION, constraint_values, parse_constraints

    constraints = parse_constraints(["personal_val_acc_p10 >= 0.75", "train_loss <= 2", "personal_val_acc >= 0.5"])
    values = constraint_values(constraints, {"personal_val_acc_p10": 0.5, "train_loss": 1.5})
    assert values == {
        "personal_val_acc_p10 >= 0.75": 0.25,  # violated by 0.25
        "train_loss <= 2": -0.5,  # met with 0.5 to spare
        "personal_val_acc >= 0.5": MISSING_VIOLATION,  # not reported: violated
    }


def test_the_ledger_records_constraints_on_complete_trials_only(tmp_path):
    from autofl.tuning.store.ledger import Ledger

    root = make_study(tmp_path, "led", [], constraints=["personal_val_acc_p10 >= 0.75", "train_loss <= 2"],
                      sampler={"kind": "tpe"})
    ledger = Ledger(root)
    study = ledger.study(create_directions=["maximize"])
    met, missed, pruned = study.ask(), study.ask(), study.ask()
    final = {"round": 2, "personal_val_acc": 0.9, "train_loss": 1.0}
    ledger.close(met.number, {**final, "personal_val_acc_p10": 1.0}, False, ["personal_val_acc"], 2)
    ledger.close(missed.number, {**final, "personal_val_acc_p10": 0.5}, False, ["personal_val_acc"], 2)
    ledger.close(pruned.number, {**final, "round": 1, "personal_val_acc_p10": 0.5}, False, ["personal_val_acc"], 2)
    trials = study.get_trials()
    assert trials[0].constraints == {"personal_val_acc_p10 >= 0.75": -0.25, "train_loss <= 2": -1.0}
    assert trials[0].user_attrs["feasible"] is True
    assert trials[1].constraints == {"personal_val_acc_p10 >= 0.75": 0.25, "train_loss <= 2": -1.0}
    assert trials[1].user_attrs["feasible"] is False
    assert trials[2].state.name == "PRUNED" and trials[2].constraints == {} and "feasible" not in trials[2].user_attrs
    assert study.best_trial.number == met.number  # Optuna's own best skips the infeasible trial too


def test_a_repeat_told_as_its_twin_carries_the_twins_constraint_values(tmp_path):
    from autofl.tuning.strategy.repeats import tell_as_twin

    root = make_study(tmp_path, "rep", [{"lr": 0.05, "value": 0.9, "constraints": {"train_loss <= 2": 0.5}}],
                      constraints=["train_loss <= 2"], sampler={"kind": "tpe"})
    from autofl.tuning.store.ledger import Ledger

    study = Ledger(root).study(create_directions=["maximize"])
    twin = study.get_trials()[0]
    tell_as_twin(study, study.ask({"fl.lr": FloatDistribution(0.01, 0.1)}), twin)
    assert study.get_trials()[1].constraints == {"train_loss <= 2": 0.5}


# ----- constraints: an infeasible trial is never the best ---------------------------------------


CONSTRAINED = {"constraints": ["personal_val_acc_p10 >= 0.75"], "sampler": {"kind": "tpe"}}


def three_trials(tmp_path: Path, name: str, feasible: tuple[bool, bool, bool]) -> Path:
    return make_study(
        tmp_path,
        name,
        [
            {"lr": 0.02 * (i + 1), "value": value, "attrs": {"feasible": ok},
             "constraints": {"personal_val_acc_p10 >= 0.75": -0.1 if ok else 0.1}}
            for i, (value, ok) in enumerate(zip((0.5, 0.9, 0.7), feasible))
        ],
        **CONSTRAINED,
    )


def test_export_status_and_reeval_skip_an_infeasible_best(tmp_path, capsys):
    from autofl.tuning.reeval import candidates
    from autofl.tuning.store.study import StudyFolder

    root = three_trials(tmp_path, "con", (True, False, True))  # the highest value (0.9, trial 1) is infeasible
    home = tmp_path / "home"
    code, out, err = cli(capsys, "best-config", "export", "con", "--reeval", "0", "--dir", home, "-o", tmp_path / "best.yaml")
    assert code == 0, err
    exported = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert exported["metadata"]["trial"] == 2 and exported["metadata"]["objective_value"] == 0.7
    code, out, err = cli(capsys, "status", "con", "--dir", home)
    assert code == 0, err
    assert "infeasible" in out
    assert "constraints: personal_val_acc_p10 >= 0.75; 2 of 3 completed trials feasible (infeasible, never" in out
    assert [c.trial for c in candidates(StudyFolder(root), top=3)] == [None, 2, 0]  # the default, then feasible only
    code, _, err = cli(capsys, "report", "con", "--dir", home)
    assert code == 0, err
    page = (root / "report" / "report.html").read_text()
    assert "best trial #2" in page and "2 of 3 completed trials feasible" in page


def test_the_live_views_best_so_far_is_never_infeasible(tmp_path):
    import io

    from rich.console import Console

    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.tune.live_view import LiveView

    view = LiveView(Ledger(three_trials(tmp_path, "live", (True, False, True))), Console(file=io.StringIO()))
    view.setup()
    assert view.best == (0.7, 2) and view.finished_before == 3


def test_export_with_no_feasible_trial_is_one_line_exit_2(tmp_path, capsys):
    three_trials(tmp_path, "none", (False, False, False))
    out_file = tmp_path / "best.yaml"
    code, _, err = cli(capsys, "best-config", "export", "none", "--reeval", "0", "--dir", tmp_path / "home", "-o", out_file)
    assert code == 2 and len(err.splitlines()) == 1
    assert "none of its 3 completed trials meets the constraints (personal_val_acc_p10 >= 0.75)" in err
    assert not out_file.exists()


def test_reeval_never_picks_a_candidate_whose_seed_mean_misses_a_constraint(tmp_path):
    from autofl.tuning.reeval import DEFAULT_LABEL, Candidate, Run, record_run, summarize
    from autofl.tuning.store.study import StudyFolder

    study = StudyFolder(three_trials(tmp_path, "rv", (True, True, True)))
    default = Candidate(DEFAULT_LABEL, None, {}, None)
    searched = Candidate("trial-2", 2, {"fl.lr": 0.06}, 0.7)
    runs = [Run(c, seed, False) for c in (default, searched) for seed in (1000, 1001)]
    # the default has the better mean objective, but its p10 averages 0.7 over the seeds: below 0.75
    p10 = {(DEFAULT_LABEL, 1000): 0.5, (DEFAULT_LABEL, 1001): 0.9, ("trial-2", 1000): 0.8, ("trial-2", 1001): 0.8}
    for run in runs:
        value = 0.9 if run.candidate is default else 0.6
        record_run(study, run, {"personal_val_acc": value, "personal_val_acc_p10": p10[(run.candidate.label, run.seed)]})
    summary = summarize(study, [default, searched], runs)
    assert [r.get("violated") for r in summary["rows"]] == [["personal_val_acc_p10 >= 0.75"], []]
    assert summary["best"] == "trial-2"


# ----- warm start -------------------------------------------------------------------------------------


def source_study(tmp_path: Path) -> Path:
    """Study `old`: lr 0.02, 0.04, 0.06 COMPLETE (values 0.5, 0.6, 0.7), lr 0.03 PRUNED at round 1."""
    return make_study(
        tmp_path,
        "old",
        [
            {"lr": 0.02, "value": 0.5},
            {"lr": 0.04, "value": 0.6},
            {"lr": 0.06, "value": 0.7},
            {"lr": 0.03, "value": 0.2, "state": "PRUNED"},
        ],
    )


def new_space(**extra: Any):
    from autofl.tuning.strategy.space import parse_space

    return parse_space(space_dict("new", **extra), "new.yaml")


def test_warm_start_takes_fitting_trials_back_fills_new_params_and_says_why_it_skipped(tmp_path):
    from autofl.tuning.strategy.warm_start import plan

    source_study(tmp_path)
    space = new_space(params={"fl.lr": {"type": "float", "low": 0.01, "high": 0.05},
                              "fl.momentum": {"type": "float", "low": 0.5, "high": 0.95}})
    warm = plan(tmp_path / "home", "old", "new", space)
    assert [t.params for t in warm.taken] == [
        {"fl.lr": 0.02, "fl.momentum": 0.9},  # momentum back-filled: the base value the old trial trained with
        {"fl.lr": 0.04, "fl.momentum": 0.9},
        {"fl.lr": 0.03, "fl.momentum": 0.9},
    ]
    assert [t.state.name for t in warm.taken] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert [t.value for t in warm.taken] == [0.5, 0.6, None]
    assert warm.taken[2].intermediate_values == {1: 0.2}  # a pruned trial keeps its per-round values
    assert warm.taken[0].user_attrs["warm_start_from"] == "old#0"
    assert warm.line() == (
        "warm start from old: took 3 of its 4 finished trials (2 complete, 1 pruned); "
        "1 skipped: #2 fl.lr=0.06 outside [0.01, 0.05]"
    )


def test_warm_start_skips_a_back_fill_outside_the_range_and_a_config_trained_otherwise(tmp_path):
    from autofl.tuning.strategy.warm_start import plan

    source_study(tmp_path)
    home = tmp_path / "home"
    narrow = new_space(params={"fl.lr": LR, "fl.momentum": {"type": "float", "low": 0.1, "high": 0.5}})
    warm = plan(home, "old", "new", narrow)
    assert warm.taken == [] and {why for _, why in warm.skipped} == {"fl.momentum=0.9 outside [0.1, 0.5] (back-filled)"}
    longer = new_space(base={**BASE, "fl": {"rounds": 3}})
    warm = plan(home, "old", "new", longer)
    assert len(warm.skipped) == 4 and warm.skipped[0] == (0, "trained with fl.rounds=2, here 3")
    other_objective = new_space(objective="personal_val_acc_p10")  # the old trials reported no p10
    warm = plan(home, "old", "new", other_objective)
    assert [why for _, why in warm.skipped] == ["reported no personal_val_acc_p10"] * 3 + [
        "pruned, with per-round values of personal_val_acc, not of personal_val_acc_p10 alone"
    ]


def test_warm_started_trials_count_against_no_budget_and_get_the_new_constraints(tmp_path):
    from autofl.tuning.store.ledger import Ledger, counted
    from autofl.tuning.store.study import StudyFolder
    from autofl.tuning.strategy.warm_start import apply, plan

    source_study(tmp_path)
    home = tmp_path / "home"
    space = new_space(constraints=["personal_val_acc >= 0.55"], sampler={"kind": "tpe"})
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(space_dict("new", constraints=["personal_val_acc >= 0.55"], sampler={"kind": "tpe"})))
    from autofl.tuning.store import study as st

    folder = st.create_study(home, path, space, None)
    warm = plan(home, "old", "new", space)
    apply(folder, warm)
    apply(folder, warm)  # a retried start adds nothing twice
    trials = Ledger(folder.root).trials()
    assert len(trials) == 4 and not any(counted(t) for t in trials)
    assert Ledger(folder.root).rounds_used() == {}  # they trained no round here
    assert [t.user_attrs.get("feasible") for t in trials] == [False, True, True, None]
    assert StudyFolder(folder.root).meta()["warm_start"]["taken"] == 4
    assert st.best_trial(StudyFolder(folder.root)).params == {"fl.lr": 0.06}


def test_warm_start_refusals_are_one_line_exit_2_and_write_nothing(tmp_path, capsys):
    source_study(tmp_path)
    home = tmp_path / "home"
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(space_dict("new")))
    for args, message in [
        (["--space", path, "--warm-start", "nope"], "--warm-start: study 'nope' not found in"),
        (["--space", path, "--name", "old2", "--warm-start", "old2"], "--warm-start old2: is the study being created"),
        (["--resume", "old", "--warm-start", "old"], "--warm-start: applies to a new study"),
    ]:
        code, _, err = cli(capsys, "search", *args, "--dir", home)
        assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert sorted(p.name for p in home.iterdir()) == ["old"]


def test_warm_start_argument_is_checked_like_the_others():
    import autofl

    with pytest.raises(AutoFLError, match=r"search: warm_start=3 is not allowed; allowed: the name \(str\)"):
        autofl.search("x.yaml", warm_start=3)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_warm_started_constrained_search_trains_only_its_own_trials(tmp_path, capsys):
    """End to end (Ray): 2 new trials on top of the 4 warm-started, none of which trains again; the
    trained ones get their constraint values through the search's own ledger, and the export is feasible."""
    from autofl.tuning.store.ledger import Ledger

    source_study(tmp_path)
    home = tmp_path / "home"
    path = tmp_path / "new.yaml"
    path.write_text(yaml.safe_dump(space_dict(
        "new", trials=2, scheduler={"kind": "none"}, start_from_base=False,
        constraints=["personal_val_acc >= 0.55"], sampler={"kind": "tpe"})))
    code, out, err = cli(capsys, "search", "--space", path, "--warm-start", "old", "--dir", home)
    assert code == 0, err
    assert "warm start from old: took 4 of its 4 finished trials (3 complete, 1 pruned)" in out
    trials = Ledger(home / "new").trials()
    warm = [t for t in trials if "warm_start_from" in t.user_attrs]
    trained = [t for t in trials if "tune_trial_id" in t.user_attrs]
    assert len(warm) == 4 and not any("tune_trial_id" in t.user_attrs for t in warm)  # none trained again
    assert len(trained) == 2 and all(t.state.name == "COMPLETE" for t in trained)  # the budget: 2 new trials
    for t in trained:
        margin = 0.55 - t.user_attrs["personal_val_acc"]
        assert t.constraints == {"personal_val_acc >= 0.55": pytest.approx(margin)}
        assert t.user_attrs["feasible"] is (margin <= 0)
    code, _, err = cli(capsys, "best-config", "export", "new", "--reeval", "0", "--dir", home, "-o", tmp_path / "best.yaml")
    assert code == 0, err
    picked = yaml.safe_load((tmp_path / "best.yaml").read_text())["metadata"]["trial"]
    assert next(t for t in trials if t.number == picked).user_attrs["feasible"] is True


@pytest.mark.parametrize("kind", ["tpe", "gp"])
def test_the_constraint_samplers_propose_from_constrained_trials(tmp_path, kind):
    """The study's own sampler (TrialSeededSampler) past its startup trials, on trials the ledger
    closed with constraint values: it proposes in range and Optuna's best is feasible."""
    from autofl.tuning.store.ledger import Ledger
    from autofl.tuning.strategy.space import DefineByRun, load_space
    from autofl.tuning.strategy.trial_sampler import TrialSeededSampler

    root = make_study(tmp_path, "smp", [], constraints=["train_loss <= 1"],
                      sampler={"kind": kind, "n_startup_trials": 2})
    space = load_space(root / "space.yaml")
    ledger = Ledger(root)
    sampler = TrialSeededSampler(space)
    study = ledger.study(sampler=sampler, create_directions=["maximize"])
    for _ in range(5):
        trial = study.ask()
        DefineByRun(space)(trial)
        lr = trial.params["fl.lr"]
        assert 0.01 <= lr <= 0.1
        # higher lr: higher value, but the loss bound holds only below lr 0.05
        ledger.close(trial.number, {"round": 2, "personal_val_acc": lr, "train_loss": 20 * lr}, False,
                     ["personal_val_acc"], 2)
    trials = study.get_trials()
    assert all(set(t.constraints) == {"train_loss <= 1"} for t in trials)
    assert study.best_trial.user_attrs["feasible"] is True and study.best_trial.params["fl.lr"] <= 0.05

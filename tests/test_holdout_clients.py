"""Clients held out of training (issue 40 item 1): `data.holdout_clients` keeps clients out of every
round; at each evaluated round they are personalized as newcomers (the method's local step from the
global model, `eval.newcomer_epochs` epochs, on their own training split) and tested: unseen_val_acc,
unseen_test_acc and participation_gap. Tiny runs (digits, mlp) in float64."""

from __future__ import annotations

import pytest
import torch

from autofl.data.datasets import load_raw_dataset
from autofl.data.federated import build_federated
from autofl.engine.metrics import count_correct
from autofl.engine.simulation import Simulation
from autofl.errors import ConfigError
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class
from autofl.tuning.strategy.space import parse_space

TINY = ["data.num_clients=6", "fl.participation=0.5", "fl.rounds=2", "runtime.compile=off", "runtime.dtype=float64"]
UNSEEN = ("unseen_val_acc", "unseen_test_acc", "participation_gap")


def run(method: str, *extra: str, executor: str = "sequential") -> tuple[Simulation, list[dict]]:
    exp = load_experiment(None, [*TINY, f"method.name={method}", f"runtime.executor={executor}", *extra])
    sim = Simulation(exp, get_method_class(method))
    return sim, list(sim.run())


def splits(data) -> list[tuple[list, list, list]]:
    return [(c.train.tolist(), c.val.tolist(), c.test.tolist()) for c in data]


def test_held_out_clients_are_those_of_the_same_partition_and_never_train():
    exp = load_experiment(None, [*TINY, "data.holdout_clients=2"])
    raw = load_raw_dataset(exp.data)
    full = build_federated(raw, load_experiment(None, TINY).data, exp.data_seed())
    held = build_federated(raw, exp.data, exp.data_seed())
    assert (len(held.clients), len(held.newcomers)) == (4, 2)
    # the partition and each client's split are those without a holdout; the held-out ones are 2 of them
    assert sorted(splits(held.clients) + splits(held.newcomers)) == sorted(splits(full.clients))
    assert splits(build_federated(raw, exp.data, exp.data_seed()).newcomers) == splits(held.newcomers)  # seeded
    assert exp.clients_per_round() == 2  # participation x the 4 training clients
    sim, _ = run("fedavg", "data.holdout_clients=2")
    assert set(sim.client_states) <= {0, 1, 2, 3}  # only training clients ever took part


@pytest.mark.parametrize(("value", "count"), [(0.25, 2), (0.1, 1), (3, 3), (3.0, 3), (0, 0)])
def test_a_count_or_a_fraction_rounding_half_up_to_at_least_one(value, count):
    exp = load_experiment(None, ["data.num_clients=6", f"data.holdout_clients={value}"])
    assert exp.data.holdout_count() == count and exp.data.training_clients() == 6 - count


@pytest.mark.parametrize("value", ["6", "0.99", "2.5", "-1"])
def test_a_holdout_that_leaves_no_training_client_or_is_no_count_is_one_line_naming_the_field(value):
    with pytest.raises(ConfigError) as err:
        load_experiment(None, ["data.num_clients=6", f"data.holdout_clients={value}"])
    assert "data.holdout_clients" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["fedavg", "fedrep", "ditto", "fdcl"])
def test_unseen_metrics_are_reported_and_the_gap_is_personal_minus_unseen(method):
    _, rounds = run(method, "data.holdout_clients=2")
    for metrics in rounds:
        assert all(0 <= metrics[k] <= 1 for k in UNSEEN[:2])
        assert metrics["participation_gap"] == pytest.approx(metrics["personal_test_acc"] - metrics["unseen_test_acc"])
    _, plain = run(method)
    assert not any(k in m for m in plain for k in UNSEEN)


def test_newcomers_never_reach_training_only_their_own_metrics():
    """Training newcomers longer changes nothing of the training clients' run, round by round."""
    _, zero = run("ditto", "data.holdout_clients=2", "eval.newcomer_epochs=0")
    _, three = run("ditto", "data.holdout_clients=2", "eval.newcomer_epochs=3")
    drop = lambda m: {k: v for k, v in m.items() if k not in UNSEEN and not k.startswith("unseen_")}  # noqa: E731
    assert [drop(m) for m in zero] == [drop(m) for m in three]
    assert [m["unseen_val_acc"] for m in zero] != [m["unseen_val_acc"] for m in three]


def test_with_no_newcomer_epochs_a_fedavg_newcomer_is_tested_on_the_global_model():
    sim, rounds = run("fedavg", "data.holdout_clients=2", "eval.newcomer_epochs=0")
    sim.model.load_state_dict(sim.global_state)
    sim.model.eval()
    data = sim.data
    test = torch.cat([c.test for c in data.newcomers])
    assert rounds[-1]["unseen_test_acc"] == count_correct(sim.model, data.x[test], data.y[test]) / len(test)


@pytest.mark.parametrize("method", ["fedrep", "ditto", "fedsiam_da"])
def test_newcomers_are_personalized_alike_under_either_executor(method):
    _, sequential = run(method, "data.holdout_clients=2", executor="sequential")
    _, vectorized = run(method, "data.holdout_clients=2", executor="vectorized")
    for s, v in zip(sequential, vectorized):
        assert s.keys() == v.keys()
        for k in UNSEEN:
            assert s[k] == pytest.approx(v[k], abs=1e-12), (k, s[k], v[k])


def _space(base_data: dict, **extra) -> dict:
    return {"study": "s", "trials": 2, "base": {"data": base_data, "fl": {"rounds": 2}},
            "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}, **extra}


def test_unseen_val_acc_may_be_the_objective_of_a_study_with_held_out_clients_only():
    assert parse_space(_space({"holdout_clients": 2}, objective="unseen_val_acc"), "s.yaml").objective == "unseen_val_acc"
    with pytest.raises(ConfigError, match="objective: unseen_val_acc needs clients held out"):
        parse_space(_space({}, objective="unseen_val_acc"), "s.yaml")
    with pytest.raises(ConfigError, match="not a validation metric"):
        parse_space(_space({"holdout_clients": 2}, objective="unseen_test_acc"), "s.yaml")


# ----- status, re-evaluation and the report show them ---------------------------------------------
def test_status_shows_unseen_val_and_reeval_and_the_report_show_the_unseen_test_columns(tmp_path, capsys):
    import io

    import optuna
    import yaml
    from rich.console import Console

    from autofl.cli import main
    from autofl.tuning import reeval
    from autofl.tuning.strategy.objectives import REPORTED_KEYS
    from autofl.tuning.store.study import StudyFolder
    from autofl.views import reeval_table, report_card, report_card_table

    assert set(UNSEEN) <= set(REPORTED_KEYS)  # what the ledger keeps of a trial's last result
    home = tmp_path / "home"
    root = home / "s"
    root.mkdir(parents=True)
    (root / "space.yaml").write_text(yaml.safe_dump({
        "study": "s", "base": {"data": {"holdout_clients": 2}, "fl": {"rounds": 2, "lr": 0.05}},
        "params": {"fl.lr": {"type": "float", "low": 0.001, "high": 1.0}}}))
    ot = optuna.create_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}", direction="maximize")
    dist = {"fl.lr": optuna.distributions.FloatDistribution(0.001, 1.0)}
    for lr, value in ((0.05, 0.8), (0.1, 0.9)):
        ot.add_trial(optuna.trial.create_trial(params={"fl.lr": lr}, distributions=dist, value=value,
                                               user_attrs={"round": 2, "unseen_val_acc": value - 0.1234}))
    assert main(["status", "s", "--dir", str(home)]) == 0
    out = capsys.readouterr().out
    assert "unseen val" in out and "0.7766" in out and "unseen_test" not in out  # no test metric in status

    study = StudyFolder(root)
    chosen, runs = reeval.plan(study, seeds=2, top=1, vary_partition=False)
    for run in runs:
        gain = 0.05 if run.candidate.label != "default" else 0.0
        reeval.record_run(study, run, {"round": 2, "personal_val_acc": 0.8 + gain, "personal_test_acc": 0.78 + gain,
                                       "unseen_test_acc": 0.6 + gain + run.seed % 2 / 100,
                                       "participation_gap": 0.18 - run.seed % 2 / 100, "harmed_frac": 0.2})
    summary = reeval.summarize(study, chosen, runs)
    row = {r["candidate"]: r for r in summary["rows"]}
    assert row["trial-1"]["unseen_test_acc"]["mean"] == pytest.approx(0.655)
    assert row["default"]["participation_gap"]["mean"] == pytest.approx(0.175)
    header, body = report_card(summary)
    assert header == ["config", "test acc (sample-weighted)", "unseen clients", "participation gap", "harmed (vs local)"]
    assert body[1][0] == "trial-1 (best)" and body[1][4] == "0.2000 ± 0.0000"  # the same in both seeds
    unseen = row["trial-1"]["unseen_test_acc"]
    assert body[1][2] == f"{unseen['mean']:.4f} ± {unseen['ci_high'] - unseen['mean']:.4f}"
    assert body[0][3].startswith("+0.1750 ± ")  # the gap is signed
    text = io.StringIO()
    Console(file=text, width=250).print(reeval_table(summary), report_card_table(summary))
    assert "unseen clients" in text.getvalue() and "harmed (vs FedAvg)" not in text.getvalue()  # none reported it
    reeval.save_summary(study, summary)
    assert main(["report", "s", "--dir", str(home), "-o", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    card = page[page.index("<h2>Report card</h2>"):]
    assert "unseen clients" in card and "participation gap" in card and "harmed (vs local)" in card
    assert f"[{unseen['ci_low']:.4f}, {unseen['ci_high']:.4f}]" in card  # the report shows the CI's bounds

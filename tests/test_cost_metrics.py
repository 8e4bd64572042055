"""What a run costs (issue 40 item 3): bytes up and down counted from what each method really ships,
training FLOPs per round, rounds to a target accuracy; and that these reach the ledger, `autofl
status` and the report. Exact counts on tiny runs (digits, mlp, 4 clients, 2 rounds)."""

from __future__ import annotations

import optuna
import pytest
import torch
import yaml
from torch import nn

from autofl.cli import main
from autofl.engine.cost import rounds_to_target, round_samples, tensor_bytes, train_flops_per_sample
from autofl.engine.metric_keys import COST_KEYS
from autofl.engine.plan import Stage, Update
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.features import ClassStats
from autofl.methods.registry import get_method_class
from autofl.tuning.strategy.objectives import REPORTED_KEYS
from autofl.tuning.store.storage import open_storage
from autofl.tuning.store.study import StudyFolder
from conftest import new_ledger

TINY = ["data.num_clients=4", "fl.participation=0.5", "fl.rounds=2", "runtime.compile=off"]
SAMPLED = 2  # 0.5 x 4 clients


def run(method: str, *extra: str) -> tuple[Simulation, list[dict]]:
    exp = load_experiment(None, [*TINY, f"method.name={method}", *extra])
    sim = Simulation(exp, get_method_class(method))
    return sim, list(sim.run())


def nbytes(tensors) -> int:
    """numel x 4 of float32 tensors, asserting they are float32 (the expected counts below are written so)."""
    tensors = list(tensors)
    assert all(t.dtype == torch.float32 for t in tensors)
    return sum(t.numel() * 4 for t in tensors)


# ----- counting on fixed values --------------------------------------------------------------------
def test_tensor_bytes_is_numel_times_element_size_over_any_tree():
    stats = ClassStats(torch.zeros(10), torch.zeros(10, 3))  # covs None: counts 0
    tree = {"w": torch.zeros(3, 4), "n": torch.zeros(2, dtype=torch.int64), "mask": torch.zeros(5, dtype=torch.bool),
            "stats": [stats, None, 1.5], "half": (torch.zeros(4, dtype=torch.float16),)}
    assert tensor_bytes(tree) == 48 + 16 + 5 + (10 + 30) * 4 + 8


def test_flops_per_sample_of_a_fixed_mlp_is_its_matmuls_forward_and_backward():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # forward 2*(4*5 + 5*3); backward: both weight gradients, and the input gradient of the second layer only
    assert train_flops_per_sample(model, (4,), 3) == 2 * (20 + 15) + 2 * (20 + 15) + 2 * 15
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # measured on a meta copy
    assert all(p.grad is None for p in model.parameters())


class ReadsAValue(nn.Module):
    """A forward that reads a tensor's value: it cannot run on the meta device."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x) * float(x.abs().max())


def test_a_model_whose_flops_cannot_be_counted_reports_none_rather_than_failing():
    assert train_flops_per_sample(ReadsAValue(), (4,), 3) is None


def test_round_samples_counts_every_update_of_every_stage_over_the_batches_the_executors_cut():
    upd = Update(("model.",), lambda ws, x, y, f: x.sum())
    stages = [Stage((upd,)), Stage((upd, upd), epochs=3)]
    # batch 2: 5 samples -> batches of 2, 2 (the lone last one dropped); 3 -> one batch of 2
    assert round_samples(stages, [5, 3], local_epochs=2, batch_size=2) == (2 * 1 + 3 * 2) * (4 + 2)


def test_rounds_to_target_is_the_first_evaluated_round_reaching_the_target():
    history = [{"round": 2, "acc": 0.5}, {"round": 4, "acc": 0.7}, {"round": 6, "acc": 0.6}, {"round": 8, "acc": 0.8}]
    assert rounds_to_target(history, "acc", 0.7) == 4  # reached exactly
    assert rounds_to_target(history, "acc", 0.75) == 8
    assert rounds_to_target(history, "acc", 0.5) == 2
    assert rounds_to_target(history, "acc", 0.9) is None
    assert rounds_to_target(history, "other", 0.1) is None


# ----- what each method ships ----------------------------------------------------------------------
def test_fedavg_sends_every_entry_both_ways_to_each_sampled_client():
    sim, history = run("fedavg")
    per_client = nbytes(sim.model.state_dict().values())
    for m in history:
        assert m["upload_bytes"] == m["download_bytes"] == m["round"] * SAMPLED * per_client
        assert m["upload_bytes_per_round"] == m["download_bytes_per_round"] == SAMPLED * per_client


def test_fedper_ships_only_the_body():
    sim, history = run("fedper")
    state = sim.model.state_dict()
    body = nbytes(v for k, v in state.items() if not k.startswith("head."))
    assert 0 < body < nbytes(state.values())
    assert history[-1]["upload_bytes"] == history[-1]["download_bytes"] == 2 * SAMPLED * body


def test_fedproto_ships_prototypes_only():
    sim, history = run("fedproto")
    c, d = sim.data.num_classes, sim.model.feature_dim
    up = (c + c * d) * 4  # class counts and class means, float32
    down = c * d * 4 + c  # global prototypes and the bool mask of classes that have one
    first, second = history
    assert first["upload_bytes"] == SAMPLED * up and first["download_bytes"] == 0  # no prototype before round 1
    assert second["upload_bytes"] == 2 * SAMPLED * up and second["download_bytes"] == SAMPLED * down


def test_fedfcd_counts_the_first_lfrs_of_every_client_and_the_server_trained_head_it_sends():
    sim, history = run("fedfcd")
    c, d, clients = sim.data.num_classes, sim.model.feature_dim, sim.num_clients
    lfr = (c + c * d) * 4
    head = nbytes(v for k, v in sim.model.state_dict().items() if k.startswith("global_head."))
    last = history[-1]
    assert last["upload_bytes"] == (clients + 2 * SAMPLED) * lfr  # every client's LFRs before round 1
    assert last["download_bytes"] == 2 * SAMPLED * (head + c * d * 4 + c)  # phi_g and the GFRs


def test_flops_per_round_is_per_sample_flops_times_the_samples_trained():
    sim, history = run("fedavg", "fl.participation=1.0", "fl.local_epochs=2", "fl.batch_size=16")
    per_sample = train_flops_per_sample(sim.model, sim.data.input_shape, sim.data.num_classes)
    samples = sum(2 * sum(b - a for a, b in _cuts(len(c.train), 16)) for c in sim.data.clients)
    assert history[-1]["flops_per_round"] == per_sample * samples
    assert history[-1]["train_flops"] == 2 * per_sample * samples


def _cuts(n: int, batch: int):
    from autofl.engine.executor import batch_cuts

    return batch_cuts(n, batch)


def test_rounds_to_target_is_reported_once_reached_and_left_out_before():
    _, history = run("fedavg", "eval.target_acc=0.01")
    assert [m["rounds_to_target"] for m in history] == [1, 1]
    _, history = run("fedavg", "eval.target_acc=1.0", "eval.target_metric=global_test_acc")
    assert all("rounds_to_target" not in m for m in history)
    _, history = run("fedavg")  # no target: not reported
    assert all("rounds_to_target" not in m for m in history)


def test_a_bad_target_is_one_line_naming_the_field():
    with pytest.raises(Exception, match="eval.target_metric"):
        load_experiment(None, ["eval.target_metric=train_loss"])
    with pytest.raises(Exception, match="eval.target_acc"):
        load_experiment(None, ["eval.target_acc=1.5"])


def test_cost_is_the_same_under_every_executor_and_survives_a_restore():
    seq, seq_history = run("fedproto", "runtime.executor=sequential")
    vec, vec_history = run("fedproto", "runtime.executor=vectorized")
    assert type(vec.executor).__name__ == "VectorizedExecutor"
    for a, b in zip(seq_history, vec_history):
        assert {k: a.get(k) for k in COST_KEYS} == {k: b.get(k) for k in COST_KEYS}
    # a run restored after round 1 counts on from where it stopped
    exp = load_experiment(None, [*TINY, "method.name=fedproto"])
    first = Simulation(exp, get_method_class("fedproto"))
    first.run_round()
    restored = Simulation(exp, get_method_class("fedproto"))
    restored.load_state_dict(first.state_dict())
    assert restored.run_round()["upload_bytes"] == seq_history[-1]["upload_bytes"]


# ----- the study side ------------------------------------------------------------------------------
def test_the_ledger_keeps_the_cost_keys(tmp_path):
    assert set(COST_KEYS) <= set(REPORTED_KEYS)
    ledger = new_ledger(tmp_path)
    number = ledger.ask("run-1", "t1", set(), 10, optuna.samplers.RandomSampler(seed=0),
                        lambda trial: trial.suggest_float("x", 0.0, 1.0))[0]
    result = {"round": 4, "acc": 0.8, "upload_bytes": 1000, "download_bytes_per_round": 250.0,
              "flops_per_round": 3.5e9, "rounds_to_target": 3}
    assert ledger.close(number, result, False, ["acc"], 4) == "COMPLETE"
    (trial,) = ledger.trials()
    assert {k: trial.user_attrs[k] for k in ("upload_bytes", "download_bytes_per_round", "flops_per_round",
                                             "rounds_to_target")} == {k: result[k] for k in list(result)[2:]}


def _costed_study(home):
    root = home / "c"
    root.mkdir(parents=True)
    (root / "space.yaml").write_text(yaml.safe_dump({
        "study": "c", "base": {"fl": {"rounds": 4}},
        "params": {"fl.lr": {"type": "float", "low": 0.001, "high": 1.0, "log": True}},
        "scheduler": {"kind": "none"}}))
    ot = optuna.create_study(study_name="c", storage=open_storage(StudyFolder(root).storage_url()), direction="maximize")
    dist = {"fl.lr": optuna.distributions.FloatDistribution(0.001, 1.0, log=True)}
    for i, (up, flops, target) in enumerate([(2.5e6, 3.2e9, 3), (1.25e5, 4.0e7, None)]):
        ot.add_trial(optuna.trial.create_trial(
            params={"fl.lr": 0.01 * (i + 1)}, distributions=dist, value=0.7 + 0.1 * i,
            intermediate_values={r: 0.5 + 0.05 * r + 0.1 * i for r in range(1, 5)},
            user_attrs={"round": 4, "upload_bytes": 4 * up, "download_bytes": 8 * up,
                        "upload_bytes_per_round": up, "download_bytes_per_round": 2 * up,
                        "flops_per_round": flops, **({"rounds_to_target": target} if target else {})}))
    return root


def test_status_and_report_show_the_cost_columns(tmp_path, capsys):
    home = tmp_path / "home"
    _costed_study(home)
    assert main(["status", "c", "--dir", str(home)]) == 0
    out = capsys.readouterr().out
    for text in ("upload/round", "download/round", "FLOPs/round", "rounds to target", "2.5 MB", "5 MB", "3.2 GFLOP",
                 "125 kB", "40 MFLOP"):
        assert text in out, text
    assert main(["report", "c", "--dir", str(home), "-o", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Cost</h2>" in page
    cost = page[page.index("<h2>Cost</h2>"):page.index("<h2>Figures</h2>")]
    for text in ("upload/round", "upload total", "10 MB", "20 MB", "3.2 GFLOP", "rounds to target"):
        assert text in cost, text
    assert cost.index("<td>1</td>") < cost.index("<td>0</td>")  # best first: trial 1 (0.8) before trial 0


def test_status_of_a_study_without_cost_has_no_cost_columns(tmp_path, capsys):
    home = tmp_path / "home"
    root = _costed_study(home)
    ot = optuna.load_study(study_name="c", storage=open_storage(StudyFolder(root).storage_url()))
    assert ot.trials  # the columns are there when some trial reported its cost ...
    (root.parent / "d").mkdir()
    (root.parent / "d" / "space.yaml").write_text(yaml.safe_dump({"study": "d"}))
    old = optuna.create_study(study_name="d", storage=open_storage(StudyFolder(root.parent / "d").storage_url()),
                              direction="maximize")
    old.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.5))
    assert main(["status", "d", "--dir", str(home)]) == 0  # ... and not for a study from before
    assert "upload/round" not in capsys.readouterr().out


def test_a_studys_target_watches_its_objective_unless_the_base_names_a_metric():
    from autofl.tuning.strategy.space import SearchSpace

    def target(objective: str, **eval_keys) -> dict:
        space = SearchSpace.model_validate({"study": "t", "objective": objective, "base": {"eval": eval_keys}})
        return space.base["eval"]

    assert target("personal_val_acc_p10", target_acc=0.6) == {"target_acc": 0.6, "target_metric": "personal_val_acc_p10"}
    assert target("personal_val_acc_std", target_acc=0.6) == {"target_acc": 0.6}  # a spread is not reached
    assert target("global_val_acc", target_acc=0.6, target_metric="personal_val_acc")["target_metric"] == "personal_val_acc"
    assert target("global_val_acc") == {}  # no target: nothing reported


def test_without_global_metrics_a_run_reports_none_and_the_same_personal_values():
    """eval.global_metrics false (a study of personal metrics): no global forward pass, no global_* key,
    every other value of every round unchanged; a target on a global metric is refused."""
    _, with_global = run("fedavg")
    _, without = run("fedavg", "eval.global_metrics=false")
    assert "global_test_acc" in with_global[-1] and "global_val_acc" in with_global[-1]
    for full, lean in zip(with_global, without, strict=True):
        assert not [k for k in lean if k.startswith("global_")]
        assert lean == {k: v for k, v in full.items() if not k.startswith("global_")}
    with pytest.raises(Exception, match="eval.target_metric: global_val_acc is not computed with eval.global_metrics "
                                        "false; allowed: personal_val_acc"):
        load_experiment(None, [*TINY, "eval.global_metrics=false", "eval.target_acc=0.5",
                               "eval.target_metric=global_val_acc"])


def test_the_last3_metrics_are_each_validation_accuracys_mean_over_the_last_three_evaluated_rounds():
    """autofl.engine.smoothing: `<metric>_last3` at an evaluated round is the mean of the metric over that
    round and the two evaluated before it (fewer at the start), also with eval_every > 1; what the
    global model does not compute has no twin."""
    _, every = run("fedavg", "fl.rounds=5")
    for i, m in enumerate(every):
        window = every[max(0, i - 2): i + 1]
        for base in ("personal_val_acc", "personal_val_acc_p10", "global_val_acc"):
            assert m[f"{base}_last3"] == pytest.approx(sum(w[base] for w in window) / len(window), abs=1e-12)
        assert "unseen_val_acc_last3" not in m  # no held-out clients
    _, sparse = run("fedavg", "fl.rounds=5", "fl.eval_every=2")
    assert [m["round"] for m in sparse] == [2, 4, 5]
    assert sparse[-1]["personal_val_acc_last3"] == pytest.approx(sum(m["personal_val_acc"] for m in sparse) / 3)
    _, lean = run("fedavg", "eval.global_metrics=false")
    assert not [k for k in lean[-1] if k.startswith("global_")] and "personal_val_acc_last3" in lean[-1]

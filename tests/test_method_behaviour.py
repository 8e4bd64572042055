"""Gradient routing, sharing, and behaviour of the five personalized methods on digits."""

import pytest
import torch
import torch.nn.functional as F

from autofl.experiment import load_experiment
from autofl.engine.simulation import Simulation
from autofl.methods.base import sgd_epochs
from conftest import read_metrics

PERSONALIZED = ["fdcl", "fedeccr", "dualfed", "fedsiam_da", "fedfcd"]


def sim_for(method: str, *extra: str, rounds: int = 2) -> Simulation:
    return Simulation(load_experiment(None, [f"method.name={method}", f"fl.rounds={rounds}", "data.num_clients=4",
                                             "data.partition.kind=pathological", "data.partition.classes_per_client=3", *extra]))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def changed(before: dict, module: torch.nn.Module) -> set[str]:
    return {k for k, v in module.state_dict().items() if not torch.equal(before[k], v)}


def test_fdcl_frozen_copies_receive_no_gradient():
    sim = sim_for("fdcl", "data.partition.kind=iid")
    sim.run_round()  # every client now has a previous model
    received = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run_round()
    for name in ("glob", "prev"):
        spare = sim.method._spares[name]
        assert all(p.grad is None and not p.requires_grad for p in spare.parameters())
    # glob still holds the global model the clients received: local training never touched it
    for k, v in sim.method._spares["glob"].state_dict().items():
        assert torch.equal(v, received[k]), k


def test_fedsiam_da_routing():
    sim = sim_for("fedsiam_da")
    received = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run_round()
    siamese = sim.method._spares["siamese"]
    # f' trained on its own term: it moved away from the received global model
    assert any(not torch.equal(v, received[k]) for k, v in siamese.state_dict().items() if "weight" in k)
    hist = sim.method._spares["hist"]
    assert all(p.grad is None and not p.requires_grad for p in hist.parameters())


def test_fedsiam_da_with_mu_zero_trains_local_model_like_plain_sgd():
    """With mu = 0 the Siamese and history terms route no gradient into the local model, and f''s own
    updates never touch it: the local model's update equals plain CE SGD from the same start."""
    a = sim_for("fedsiam_da", "method.mu=0", rounds=1)
    b = sim_for("fedsiam_da", "method.mu=0", rounds=1)
    ctx_a, ctx_b = a.client_context(0), b.client_context(0)
    a.method.load_client(a.model, a.global_state, ctx_a.state)
    a.method.local_train(ctx_a)
    b.method.load_client(b.model, b.global_state, ctx_b.state)
    sgd_epochs(ctx_b, b.model.parameters(), 1, lambda x, y: F.cross_entropy(b.model(x), y))
    for k, v in a.model.state_dict().items():
        if k.startswith("predictor.") and not k.endswith("weight") and not k.endswith("bias"):
            continue  # the predictor's BN statistics move because the Siamese term runs it forward
        torch.testing.assert_close(v, b.model.state_dict()[k], msg=k)


def test_fedfcd_alternating_steps_touch_only_their_parameters():
    sim = sim_for("fedfcd")
    ctx = sim.client_context(0)
    model = sim.model
    sim.method.load_client(model, sim.global_state, ctx.state)
    model.train()
    x, y = next(ctx.batches())
    before = snapshot(model)
    sim.method.step_extractor(model, x, y, ctx.optimizer(model.encoder.parameters()))
    moved = changed(before, model)
    assert moved and all(k.startswith("encoder.") for k in moved)  # (a) leaves phi_i (and phi_g) unchanged
    before = snapshot(model)
    sim.method.step_personal_head(model, x, y, ctx.optimizer(model.head.parameters()))
    moved = changed(before, model)
    assert moved and all(k.startswith("head.") for k in moved)  # (b) leaves theta (and phi_g) unchanged


def test_dualfed_stage2_changes_only_the_global_head():
    sim = sim_for("dualfed", "model.projector_depth=2")
    ctx = sim.client_context(1)
    sim.method.load_client(sim.model, sim.global_state, ctx.state)
    before = snapshot(sim.model)
    sim.method.train_stage2(ctx)
    moved = changed(before, sim.model)
    assert moved and all(k.startswith("global_head.") for k in moved)
    before = snapshot(sim.model)
    sim.method.train_stage1(ctx)
    moved = changed(before, sim.model)
    assert not any(k.startswith("global_head.") for k in moved)  # h_g frozen in stage 1
    assert any(k.startswith("projector.") for k in moved) and any(k.startswith("encoder.") for k in moved)


@pytest.mark.parametrize("method,private_prefixes", [("dualfed", ("projector.", "head.")),
                                                     ("fedfcd", ("encoder.", "head."))])
def test_private_parameters_differ_across_clients_and_shared_equal_the_aggregate(method, private_prefixes):
    sim = sim_for(method)
    sim.run_round()
    privates = [sim.client_states[c]["private"] for c in range(4)]
    for key in privates[0]:
        if key.startswith(private_prefixes) and privates[0][key].is_floating_point() and "weight" in key:
            assert not torch.equal(privates[0][key], privates[1][key]), key
            assert not torch.equal(privates[0][key], sim.global_state[key]), key  # never averaged
    if method == "dualfed":
        # BN statistics of the projector are private too
        assert any(k.startswith("projector.") and k.endswith("running_mean") for k in privates[0])
        # a client starts the next round from the aggregate for shared parts, its own for private ones
        ctx = sim.client_context(2)
        sim.method.load_client(sim.model, sim.global_state, ctx.state)
        state = sim.model.state_dict()
        for k in sim.shared:
            if not k.endswith(("running_mean", "running_var", "num_batches_tracked")):
                assert torch.equal(state[k], sim.global_state[k]), k
        for k, v in privates[2].items():
            assert torch.equal(state[k], v), k


def test_fedsiam_da_global_is_the_dual_weighted_aggregate():
    sim = sim_for("fedsiam_da", rounds=1)
    sim.run_round()
    uploads = [sim.client_states[c]["personal"] for c in range(4)]
    from autofl.methods.base import weighted_average
    from autofl.methods.fedsiam_da import dual_weights

    expected = weighted_average(uploads, dual_weights(uploads, sim.method.param_keys))
    for k, v in expected.items():
        torch.testing.assert_close(sim.global_state[k], v)


@pytest.mark.slow
def test_personalized_methods_beat_fedavg_on_pathological_digits(run_cli, tmp_path):
    common = ["--set", "fl.rounds=5", "--set", "data.partition.kind=pathological",
              "--set", "data.partition.classes_per_client=2", "--set", "data.num_clients=10"]
    accs = {}
    for method in ["fedavg", *PERSONALIZED]:
        assert run_cli("train", "--out", tmp_path / method, "--set", f"method.name={method}", *common) == 0
        accs[method] = read_metrics(tmp_path / method)[-1]["personal_test_acc"]
    for method in PERSONALIZED:
        assert accs[method] > accs["fedavg"] + 0.1, accs


def _runs():
    for method in PERSONALIZED:
        for head in (1, 2):
            depths = (1, 2, 3) if method in ("dualfed", "fedsiam_da") else (None,)
            for depth in depths:
                yield method, head, depth


@pytest.mark.parametrize("method,head,depth", list(_runs()))
def test_every_method_trains_end_to_end(run_cli, tmp_path, method, head, depth):
    args = ["train", "--out", tmp_path / "r", "--set", f"method.name={method}", "--set", "fl.rounds=2",
            "--set", f"model.head_layers={head}", "--set", "data.num_clients=4", "--set", "fl.participation=0.5"]
    if depth is not None:
        args += ["--set", f"model.projector_depth={depth}", "--set", "model.projector_dim=32"]
    assert run_cli(*args) == 0
    metrics = read_metrics(tmp_path / "r")
    assert len(metrics) == 2 and 0 <= metrics[-1]["personal_test_acc"] <= 1
    assert ("global_test_acc" in metrics[-1]) == (method != "fedfcd")


def test_method_parameter_validation():
    from autofl.errors import ConfigError

    with pytest.raises(ConfigError, match="method.lam: unknown key for method fdcl; allowed keys: mu, tau"):
        load_experiment(None, ["method.name=fdcl", "method.lam=1"])
    with pytest.raises(ConfigError, match="method.server_lr: Input should be greater than 0"):
        load_experiment(None, ["method.name=fedfcd", "method.server_lr=0"])
    with pytest.raises(ConfigError, match="model.projector_depth: not used by method fedfcd"):
        load_experiment(None, ["method.name=fedfcd", "model.projector_depth=2"])
    with pytest.raises(ConfigError, match="model.projector_depth: method dualfed needs a projector"):
        load_experiment(None, ["method.name=dualfed", "model.projector_depth=0"])
    exp = load_experiment(None, ["method.name=fedeccr"])
    assert exp.method.params() == {"tau": 0.5, "M": 400, "calib_epochs": 20, "calibrate_every": 1}
    exp = load_experiment(None, ["method.name=dualfed"])
    assert (exp.model.projector_depth, exp.model.projector_dim) == (2, 256)


def test_fedprox_loss_is_ce_plus_half_mu_squared_distance_to_the_global_model():
    sim = sim_for("fedprox", "method.mu=0.5")
    ctx = sim.client_context(0)
    sim.method.load_client(sim.model, sim.global_state, ctx.state)
    x, y = next(ctx.batches())
    at_global = sim.method.loss(ctx, x, y)
    assert torch.allclose(at_global, F.cross_entropy(sim.model(x), y))  # no pull at the global model
    with torch.no_grad():
        for p in sim.model.parameters():
            p.add_(0.01)
    n = sum(p.numel() for p in sim.model.parameters())
    moved = sim.method.loss(ctx, x, y) - F.cross_entropy(sim.model(x), y)
    assert torch.allclose(moved, torch.tensor(0.5 / 2 * n * 0.01**2), rtol=1e-4)

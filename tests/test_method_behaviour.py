"""Gradient routing, sharing, and behaviour of the five personalized methods on digits."""

import pytest
import torch
import torch.nn.functional as F

from autofl.engine.executor import RoundPlan
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.base import Stage, Update
from autofl.methods.registry import get_method_class
from conftest import read_metrics

PERSONALIZED = ["fdcl", "fedeccr", "dualfed", "fedsiam_da", "fedfcd"]
EXECUTORS = ["sequential", "vectorized"]


def sim_for(method: str, *extra: str, rounds: int = 2) -> Simulation:
    return Simulation(load_experiment(None, [f"method.name={method}", f"fl.rounds={rounds}", "data.num_clients=4",
                                             "data.partition.kind=pathological", "data.partition.classes_per_client=3", *extra]),
                      get_method_class(method))


def train_client(sim: Simulation, cid: int, stages: list[Stage]) -> dict[str, torch.Tensor]:
    """Client `cid`'s trained state after running `stages` from its start of the current round."""
    plan = sim.round_plan()
    plan.stages = stages
    return sim.executor.train(plan, [sim.client_job(cid)], sim.data.x, sim.data.y)[0].state


def moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {k for k, v in after.items() if not torch.equal(before[k], v)}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fdcl_frozen_copies_are_never_written(executor):
    sim = sim_for("fdcl", "data.partition.kind=iid", f"runtime.executor={executor}")
    sim.run_round()  # every client now has a previous model
    received = dict(sim.global_state)  # the tensors the clients read as `glob`
    previous = {cid: dict(s["prev"]) for cid, s in sim.client_states.items()}
    copies = {k: v.clone() for k, v in received.items()}, {c: {k: v.clone() for k, v in p.items()}
                                                           for c, p in previous.items()}
    sim.run_round()
    assert all(torch.equal(received[k], copies[0][k]) for k in received)
    assert all(torch.equal(previous[c][k], copies[1][c][k]) for c in previous for k in previous[c])
    if executor == "sequential":
        for name in ("glob", "prev"):
            assert all(p.grad is None and not p.requires_grad for p in sim.workspace.get_submodule(name).parameters())
    assert all(not torch.equal(sim.client_states[c]["prev"][k], previous[c][k])
               for c in previous for k in previous[c] if k.endswith("weight"))  # prev moved on to this round's model


def test_fedsiam_da_routing():
    sim = sim_for("fedsiam_da", "runtime.executor=sequential")
    received = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run_round()
    siamese = sim.workspace.siamese
    # f' trained on its own term: it moved away from the received global model
    assert any(not torch.equal(v, received[k]) for k, v in siamese.state_dict().items() if "weight" in k)
    assert all(p.grad is None and not p.requires_grad for p in sim.workspace.hist.parameters())


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedsiam_da_with_mu_zero_trains_local_model_like_plain_sgd(executor):
    """With mu = 0 the Siamese and history terms route no gradient into the local model, and f''s own
    updates never touch it: the local model's update equals plain CE SGD from the same start."""
    sim = sim_for("fedsiam_da", "method.mu=0", f"runtime.executor={executor}", rounds=1)
    siamese_da = train_client(sim, 0, sim.method.local_stages(0, sim.server_state))
    plain = Update(("model.encoder.", "model.projector.", "model.head."),
                   lambda ws, x, y, flags: F.cross_entropy(ws.model.head(ws.model.projector(ws.model.encoder(x))), y))
    ce_only = train_client(sim, 0, [Stage((plain,))])
    for k, v in siamese_da.items():
        if k.startswith("predictor."):
            continue  # the predictor trains on the Siamese term (weighted 0) and runs forward
        torch.testing.assert_close(v, ce_only[k], msg=k)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedfcd_alternating_steps_touch_only_their_parameters(executor):
    sim = sim_for("fedfcd", f"runtime.executor={executor}")
    extractor_step, head_step = sim.method.local_stages(0, sim.server_state)[0].updates
    start = sim.method.start_state(sim.global_state, {})
    changed = moved(start, train_client(sim, 0, [Stage((extractor_step,))]))
    assert changed and all(k.startswith("encoder.") for k in changed)  # (a) leaves phi_i (and phi_g) unchanged
    changed = moved(start, train_client(sim, 0, [Stage((head_step,))]))
    assert changed and all(k.startswith("head.") for k in changed)  # (b) leaves theta (and phi_g) unchanged


BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_dualfed_stages_train_only_their_parameters(executor):
    sim = sim_for("dualfed", "model.projector_depth=2", f"runtime.executor={executor}")
    stage1, stage2 = sim.method.local_stages(0, sim.server_state)
    start = sim.method.start_state(sim.global_state, {})
    changed = moved(start, train_client(sim, 1, [stage2]))
    weights = {k for k in changed if not k.endswith(BN_BUFFERS)}
    assert weights and all(k.startswith("global_head.") for k in weights)
    # stage 2 runs the model in train mode, as the official code does: g's BN statistics move
    assert {k for k in changed if k.endswith(BN_BUFFERS)} == {k for k in start if k.startswith("projector.")
                                                               and k.endswith(BN_BUFFERS)}
    changed = moved(start, train_client(sim, 1, [stage1]))
    assert not any(k.startswith("global_head.") for k in changed)  # h_g frozen in stage 1
    assert any(k.startswith("projector.") for k in changed) and any(k.startswith("encoder.") for k in changed)


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
        state = sim.method.client_start(sim.global_state, sim.client_states[2], sim.server_state).models["model"]
        for k in sim.shared:
            if not k.endswith(("running_mean", "running_var", "num_batches_tracked")):
                assert torch.equal(state[k], sim.global_state[k]), k
        for k, v in privates[2].items():
            assert torch.equal(state[k], v), k


def test_fedsiam_da_global_is_the_dual_weighted_aggregate():
    sim = sim_for("fedsiam_da", rounds=1)
    sim.run_round()
    uploads = [sim.client_states[c]["personal"] for c in range(4)]
    from autofl.engine.state import weighted_average
    from autofl.methods.fedsiam_da import dual_weights

    expected = weighted_average(uploads, dual_weights(uploads, [k for k, _ in sim.model.named_parameters()]))
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


ENCODER_FEATURE_METHODS = ("fdcl", "fedeccr", "fedfcd", "fedproto")  # mlp with 2 head layers is a config error for them
BASELINES = ["fedproto", "fedrep", "ditto", "fedgh"]  # the seed papers' baselines


def _runs():
    for method in [*PERSONALIZED, *BASELINES]:
        for head in (1,) if method in ENCODER_FEATURE_METHODS else (1, 2):
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
    assert ("global_test_acc" in metrics[-1]) == get_method_class(method).has_global_model
    assert ("global_test_acc" in metrics[-1]) == (method in ("dualfed", "fdcl", "fedeccr", "fedsiam_da", "ditto"))


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
    for method in ENCODER_FEATURE_METHODS:  # their feature losses need a trainable encoder layer
        with pytest.raises(ConfigError, match=f"model.head_layers: 2 leaves arch mlp no trainable encoder, so "
                                              f"method {method}'s feature loss would be a constant; allowed: 1..1"):
            load_experiment(None, [f"method.name={method}", "model.head_layers=2"])
        assert load_experiment(None, [f"method.name={method}", "model.arch=cnn", "model.head_layers=2",
                                      "data.dataset=mnist"]).model.head_layers == 2
    exp = load_experiment(None, ["method.name=fedeccr"])
    assert exp.method.params() == {"tau": 0.5, "M": 400, "calib_epochs": 20, "calibrate_every": 1, "calib_momentum": 0.0}
    exp = load_experiment(None, ["method.name=dualfed"])
    assert (exp.model.projector_depth, exp.model.projector_dim) == (2, 256)


def test_fedprox_loss_is_ce_plus_half_mu_squared_distance_to_the_global_model():
    sim = sim_for("fedprox", "method.mu=0.5")
    ws = sim.workspace
    start = sim.method.client_start(sim.global_state, {}, sim.server_state)
    for name, state in start.models.items():
        ws.get_submodule(name).load_state_dict(state)
    x, y = sim.data.x[sim.data.clients[0].train[:16]], sim.data.y[sim.data.clients[0].train[:16]]
    at_global = sim.method.loss(ws, x, y, {})
    assert torch.allclose(at_global, F.cross_entropy(ws.model(x), y))  # no pull at the global model
    with torch.no_grad():
        for p in ws.model.parameters():
            p.add_(0.01)
    n = sum(p.numel() for p in ws.model.parameters())
    pulled = sim.method.loss(ws, x, y, {}) - F.cross_entropy(ws.model(x), y)
    assert torch.allclose(pulled, torch.tensor(0.5 / 2 * n * 0.01**2), rtol=1e-4)


def test_dualfed_stage2_normalises_the_encoder_with_batch_statistics_and_moves_its_running_ones():
    """resnet18 (BN in the encoder): stage 2 keeps f in train mode as the official code does, so f's
    running statistics move while its weights stay, and h_g trains on batch-normalised features."""
    sim = sim_for("dualfed", "model.arch=resnet18", "model.projector_depth=1", "runtime.executor=sequential",
                  rounds=1)
    stage2 = sim.method.local_stages(0, sim.server_state)[1]
    start = sim.method.start_state(sim.global_state, {})
    changed = moved(start, train_client(sim, 1, [stage2]))
    assert any(k.startswith("encoder.") and k.endswith("running_mean") for k in changed)
    assert not any(k.startswith("encoder.") and not k.endswith(BN_BUFFERS) for k in changed)
    ws = sim.workspace
    ws.enter({"model"}, stage2.updates[0])
    assert ws.model.encoder.training and ws.model.projector.training
    ws.leave()


@pytest.mark.parametrize("server_lfrs", ["round", "latest"])
def test_fedfcd_server_learns_from_this_rounds_uploads_or_every_clients_latest(server_lfrs):
    """At participation < 1, phi_g and the GFRs come from this round's uploads (the paper's
    Algorithm 1, PFLlib's FedProto) unless server_lfrs is "latest" (every client's last upload)."""
    from autofl.methods.fedfcd import global_feature_representations

    sim = sim_for("fedfcd", "fl.participation=0.5", f"method.server_lfrs={server_lfrs}", "runtime.executor=sequential")
    before = dict(sim.server_state.lfrs)  # before round 1 every client uploaded its initial LFRs
    assert sorted(before) == [0, 1, 2, 3]
    sampled = sorted(sim.sample_clients(sim.round))
    sim.run_round()
    expected = sampled if server_lfrs == "round" else [0, 1, 2, 3]
    assert sorted(sim.server_state.lfrs) == expected
    for cid in set(expected) - set(sampled):
        assert sim.server_state.lfrs[cid] is before[cid]  # an unsampled client's stale upload
    gfr, has = global_feature_representations([sim.server_state.lfrs[c] for c in expected])
    torch.testing.assert_close(sim.server_state.gfr, gfr)
    assert torch.equal(sim.server_state.has_gfr, has)


# ----- the seed papers' baselines: FedProto, FedRep, Ditto, FedGH --------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedrep_head_stage_trains_only_the_head_and_body_stage_only_the_encoder(executor):
    sim = sim_for("fedrep", "method.head_epochs=2", f"runtime.executor={executor}")
    head_stage, body_stage = sim.method.local_stages(0, sim.server_state)
    start = sim.method.start_state(sim.global_state, {})
    changed = moved(start, train_client(sim, 0, [head_stage]))
    assert changed and all(k.startswith("head.") for k in changed)
    changed = moved(start, train_client(sim, 0, [body_stage]))
    assert changed and all(k.startswith("encoder.") for k in changed)


def test_fedrep_shares_the_encoder_and_keeps_each_clients_head():
    sim = sim_for("fedrep", "method.head_epochs=1", "runtime.executor=sequential")
    sim.run_round()
    heads = [sim.client_states[c]["private"] for c in range(4)]
    assert all(set(h) == {k for k in sim.global_state if k.startswith("head.")} for h in heads)
    assert not torch.equal(heads[0]["head.0.weight"], heads[1]["head.0.weight"])
    state = sim.method.client_start(sim.global_state, sim.client_states[2], sim.server_state).models["model"]
    assert all(torch.equal(state[k], sim.global_state[k]) for k in sim.shared)  # the aggregated encoder
    assert all(torch.equal(state[k], v) for k, v in heads[2].items())  # its own head


@pytest.mark.parametrize("executor", EXECUTORS)
def test_ditto_trains_w_like_fedavg_and_keeps_v_private(executor):
    """w's update is plain CE SGD from the received model (v's stage routes nothing into it); v
    starts from the received global model at a client's first participation and stays on the
    client; the received global model (the anchor) is never written."""
    sim = sim_for("ditto", "method.lam=0.5", "data.partition.kind=iid", "fl.participation=0.5",
                  f"runtime.executor={executor}")
    plain = Update(("model.encoder.", "model.projector.", "model.head."),
                   lambda ws, x, y, flags: F.cross_entropy(ws.model(x), y))
    sampled = sim.sample_clients(0)
    start = sim.method.client_start(sim.global_state, {}, sim.server_state).models["model"]
    assert all(torch.equal(start["personal." + k], start[k]) for k in sim.shared)  # v starts at w
    ditto = train_client(sim, sampled[0], sim.method.local_stages(0, sim.server_state))
    ce_only = train_client(sim, sampled[0], [Stage((plain,))])
    assert any(not torch.equal(ditto[k], start[k]) for k in ditto if k.startswith("personal."))
    for k in sim.shared:
        torch.testing.assert_close(ditto[k], ce_only[k], msg=k)
    received = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run_round()
    for cid in sampled:
        private = sim.client_states[cid]["private"]
        assert set(private) == {k for k in received if k.startswith("personal.")}
        assert not torch.equal(private["personal.head.0.weight"], received["head.0.weight"])  # v trained
    unsampled = next(c for c in range(4) if c not in sampled)
    sim.method.load_personal(sim.model, sim.global_state, sim.client_states.get(unsampled, {}), sim.server_state)
    x = sim.data.x[:5]
    with torch.no_grad():  # a never-sampled client's personal model is the global model
        assert torch.equal(sim.method.predict(sim.model, x, {}, sim.server_state), sim.model(x))


def test_fedproto_global_prototypes_are_this_rounds_uploads_and_no_weights_are_shared():
    from autofl.features import encoded_class_stats
    from autofl.methods.fedproto import global_prototypes

    sim = sim_for("fedproto", "fl.participation=0.5", "runtime.executor=sequential")
    assert sim.shared == [] and sim.server_state.prototypes is None
    initial = {k: v.clone() for k, v in sim.global_state.items()}
    sampled = sim.sample_clients(0)
    sim.run_round()
    assert all(torch.equal(sim.global_state[k], v) for k, v in initial.items())  # nothing aggregated
    d = sim.data
    stats = []
    for cid in sampled:
        sim.model.load_state_dict(sim.client_states[cid]["private"])
        stats.append(encoded_class_stats(sim.model.encoder, d.x, d.y, d.clients[cid].train, d.num_classes))
    protos, has = global_prototypes(stats)
    torch.testing.assert_close(sim.server_state.prototypes, protos)
    assert torch.equal(sim.server_state.has_prototype, has)


def test_fedgh_clients_start_from_their_own_encoder_and_the_server_trained_head():
    from autofl.features import encoded_class_stats
    from autofl.methods.fedgh import train_global_head
    from autofl.methods.fedgh import GLOBAL_HEAD_STREAM
    from autofl.seeding import derived_seed

    sim = sim_for("fedgh", "method.server_lr=0.05", "method.server_epochs=2", "runtime.executor=sequential")
    received = {k: v.clone() for k, v in sim.global_state.items()}
    sim.run_round()
    d, heads = sim.data, {k: v for k, v in received.items() if k.startswith("head.")}
    stats = []
    for cid in range(4):
        private = sim.client_states[cid]["private"]
        assert not any(k.startswith("head.") for k in private)  # the head is the server's
        sim.model.load_state_dict({**received, **private})
        stats.append(encoded_class_stats(sim.model.encoder, d.x, d.y, d.clients[cid].train, d.num_classes))
    head = sim.method.build_model().head
    head.load_state_dict({k[len("head."):]: v for k, v in heads.items()})
    expected = train_global_head(head, stats, 0.05, 2, sim.exp.fl.batch_size,
                                 torch.Generator().manual_seed(derived_seed(sim.exp.seed, 0, GLOBAL_HEAD_STREAM)))
    for k, v in expected.items():
        torch.testing.assert_close(sim.global_state["head." + k], v)
    start = sim.method.client_start(sim.global_state, sim.client_states[1], sim.server_state).models["model"]
    assert all(torch.equal(start[k], v) for k, v in sim.client_states[1]["private"].items())
    assert all(torch.equal(start["head." + k], sim.global_state["head." + k]) for k in expected)

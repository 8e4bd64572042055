"""Whole-loss assemblies on fixed tensors against values assembled by hand: each term fed the
right model's tensors (local / global / previous in their slots), weighted as the spec says, and
switched off before a client's first participation; and `metrics.evaluate`'s sample weighting."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from autofl.engine.metrics import evaluate
from autofl.engine.simulation import Simulation
from autofl.experiment import load_experiment
from autofl.methods.registry import get_method_class


def _sim(method: str, *extra: str) -> Simulation:
    exp = load_experiment(None, [f"method.name={method}", "data.num_clients=4", "fl.rounds=1",
                                 "runtime.dtype=float64", "runtime.executor=sequential", *extra])
    return Simulation(exp, get_method_class(method))


def _distinct_copies(sim: Simulation) -> None:
    """model, glob and prev get different weights, so a tensor in the wrong slot changes the value."""
    for i, name in enumerate(("model", "glob", "prev")):
        torch.manual_seed(100 + i)
        for p in sim.workspace.get_submodule(name).parameters():
            torch.nn.init.normal_(p, std=0.3)


def _pair(a: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, tau: float) -> float:
    """-log(e^{cos(a,pos)/tau} / (e^{cos(a,pos)/tau} + e^{cos(a,neg)/tau})), batch mean, by hand."""
    total = 0.0
    for i in range(len(a)):
        cos = lambda u, v: float(u @ v) / (float(u.norm()) * float(v.norm()))  # noqa: E731
        cp, cn = cos(a[i], pos[i]), cos(a[i], neg[i])
        total += -math.log(math.exp(cp / tau) / (math.exp(cp / tau) + math.exp(cn / tau)))
    return total / len(a)


def _ce(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(np.mean([-math.log(math.exp(float(l[c])) / float(torch.exp(l).sum())) for l, c in zip(logits, y)]))


def test_fdcl_loss_is_ce_plus_mu_times_encoder_and_classifier_contrast_in_the_right_slots():
    sim = _sim("fdcl", "method.mu=0.7", "method.tau=0.4")
    _distinct_copies(sim)
    ws = sim.workspace
    x, y = sim.data.x[:6], sim.data.y[:6]
    ws.eval()
    with torch.no_grad():
        e = {n: ws.get_submodule(n).encoder(x) for n in ("model", "glob", "prev")}
        c = {n: ws.get_submodule(n).head(e[n]) for n in e}
    got = float(sim.method.loss(ws, x, y, {"has_prev": torch.tensor(1.0, dtype=x.dtype)}).detach())
    # l_e: local encoder pulled to the global one, pushed from the previous; l_c: local logits pulled
    # to the previous model's, pushed from the global's
    l_e = _pair(e["model"], e["glob"], e["prev"], 0.4)
    l_c = _pair(c["model"], c["prev"], c["glob"], 0.4)
    assert math.isclose(got, _ce(c["model"], y) + 0.7 * (l_e + l_c), rel_tol=1e-9)
    assert not math.isclose(l_e, _pair(e["model"], e["prev"], e["glob"], 0.4), rel_tol=1e-6)  # slots matter
    first = float(sim.method.loss(ws, x, y, {"has_prev": torch.tensor(0.0, dtype=x.dtype)}).detach())
    assert math.isclose(first, _ce(c["model"], y), rel_tol=1e-9)  # no previous model yet: CE alone


def test_fdcl_keeps_the_trained_model_as_next_rounds_prev_and_personal_model():
    sim = _sim("fdcl")
    sim.run_round()
    for cid in range(4):
        prev = sim.client_states[cid]["prev"]
        start = sim.method.client_start(sim.global_state, sim.client_states[cid], sim.server_state)
        assert start.flags == {"has_prev": 1.0} and start.models["prev"] is prev
        assert start.models["glob"] is sim.global_state
        sim.method.load_personal(sim.model, sim.global_state, sim.client_states[cid], sim.server_state)
        assert all(torch.equal(v, prev[k]) for k, v in sim.model.state_dict().items())
    fresh = sim.method.client_start(sim.global_state, {}, sim.server_state)
    assert fresh.flags == {"has_prev": 0.0}


def test_moon_loss_is_ce_plus_mu_times_model_contrast_on_projected_features():
    sim = _sim("moon", "method.mu=2.5", "method.tau=0.5", "model.projector_depth=2", "model.projector_dim=16")
    _distinct_copies(sim)
    ws = sim.workspace
    x, y = sim.data.x[:5], sim.data.y[:5]
    ws.eval()  # the projector's BatchNorm on its (fixed) running statistics, for both computations
    with torch.no_grad():
        z = {n: ws.get_submodule(n).projector(ws.get_submodule(n).encoder(x)) for n in ("model", "glob", "prev")}
        logits = ws.model.head(z["model"])
    got = float(sim.method.loss(ws, x, y, {"has_prev": torch.tensor(1.0, dtype=x.dtype)}).detach())
    assert math.isclose(got, _ce(logits, y) + 2.5 * _pair(z["model"], z["glob"], z["prev"], 0.5), rel_tol=1e-9)


def test_evaluate_weights_clients_by_samples_and_summarizes_their_spread():
    sim = _sim("fedper", "data.partition.kind=dirichlet", "data.partition.alpha=0.3", "data.num_clients=5")
    sim.run_round()
    got = evaluate(sim)
    correct, sizes = {"val": [], "test": []}, {"val": [], "test": []}
    for cid, split in enumerate(sim.data.clients):
        sim.method.load_personal(sim.model, sim.global_state, sim.client_states.get(cid, {}), sim.server_state)
        sim.model.eval()
        with torch.no_grad():
            for part in ("val", "test"):
                idx = getattr(split, part)
                pred = sim.method.predict(sim.model, sim.data.x[idx], sim.client_states.get(cid, {}), sim.server_state).argmax(1)
                correct[part].append(int((pred == sim.data.y[idx]).sum()))
                sizes[part].append(len(idx))
    for part in ("val", "test"):
        assert got[f"personal_{part}_acc"] == sum(correct[part]) / sum(sizes[part])  # pooled, not a mean of means
        per_client = np.array([c / n for c, n in zip(correct[part], sizes[part]) if n > 0])
        assert math.isclose(got[f"personal_{part}_acc_std"], float(per_client.std()), abs_tol=1e-12)
        assert math.isclose(got[f"personal_{part}_acc_p10"], float(np.percentile(per_client, 10)), abs_tol=1e-12)
    assert "global_test_acc" not in got  # fedper has no global model


def test_fedfcd_steps_and_fused_prediction():
    sim = _sim("fedfcd", "method.lam=3.0")
    torch.manual_seed(7)
    for p in sim.workspace.model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ws, method = sim.workspace, sim.method
    x, y = sim.data.x[:6], sim.data.y[:6]
    (stage,) = method.local_stages(0, sim.server_state)
    extractor, head = stage.updates
    # (a) trains theta only; (b) trains phi_i only; phi_g (global_head) is never trained by a client
    assert extractor.trains == ("model.encoder.",) and head.trains == ("model.head.",)
    gfr, has = sim.server_state.gfr.clone(), sim.server_state.has_gfr.clone()
    has[y[0]] = False  # a class without a GFR adds 0 to the regularizer
    server = dataclasses.replace(sim.server_state, has_gfr=has)
    (stage,) = method.local_stages(0, server)
    extractor, head = stage.updates
    ws.eval()
    with torch.no_grad():
        f = ws.model.encoder(x)
        personal, fused = ws.model.head(f), ws.model.global_head(f) + ws.model.head(f)
    d = f.shape[1]
    reg = sum(float(((f[i] - gfr[y[i]]) ** 2).sum()) / d for i in range(len(y)) if has[y[i]]) / len(y)
    flags = method.client_start(sim.global_state, {}, server).flags  # the GFRs a client downloads
    assert torch.equal(flags["gfr"], gfr) and torch.equal(flags["has_gfr"], has)
    assert math.isclose(float(extractor.loss(ws, x, y, flags).detach()), _ce(personal, y) + 3.0 * reg, rel_tol=1e-9)
    assert math.isclose(float(head.loss(ws, x, y, flags).detach()), _ce(fused, y), rel_tol=1e-9)
    assert torch.equal(method.predict(ws.model, x, {}, sim.server_state), fused)  # prediction fuses both heads' logits


def test_dualfed_predicts_with_the_sum_of_both_heads_and_aggregates_with_equal_weights():
    from autofl.methods.base import Upload

    sim = _sim("dualfed", "model.projector_depth=2", "model.projector_dim=16")
    model = sim.workspace.model
    model.eval()
    x = sim.data.x[:4]
    with torch.no_grad():
        f = model.encoder(x)
        expected = model.head(model.projector(f)) + model.global_head(f)
        assert torch.allclose(sim.method.predict(model, x, {}, sim.server_state), expected, rtol=0, atol=1e-12)
        assert torch.equal(sim.method.predict_global(model, x, sim.server_state), model.global_head(f))
    states = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}]
    uploads = [Upload(0, 10, states[0], {}, 0.0), Upload(1, 30, states[1], {}, 0.0)]
    assert torch.equal(sim.method.aggregate(uploads)["w"], torch.tensor([2.0, 4.0]))  # equal weights
    weighted = _sim("dualfed", "method.weighted=true").method
    assert torch.equal(weighted.aggregate(uploads)["w"], torch.tensor([2.5, 5.0]))  # by sample counts


def _cos_mean(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.mean([float(u @ v) / (float(u.norm()) * float(v.norm())) for u, v in zip(a, b)]))


def test_fedsiam_da_loss_mix_with_the_half_factors_and_the_history_snapshot():
    sim = _sim("fedsiam_da", "method.mu=0.3", "model.projector_depth=2", "model.projector_dim=16")
    ws = sim.workspace
    for i, name in enumerate(("model", "siamese", "hist")):
        torch.manual_seed(200 + i)
        for p in ws.get_submodule(name).parameters():
            torch.nn.init.normal_(p, std=0.3)
    (stage,) = sim.method.local_stages(0, sim.server_state)
    siamese, local = stage.updates
    assert stage.snapshot_after_epoch == {"hist": "model"} and stage.flags_after_epoch == {"has_hist": 1.0}
    assert local.trains == ("model.",) and all(t.startswith("siamese.") for t in siamese.trains)
    x, y = sim.data.x[:6], sim.data.y[:6]
    ws.eval()
    with torch.no_grad():
        z = {n: ws.get_submodule(n).projector(ws.get_submodule(n).encoder(x)) for n in ("model", "siamese", "hist")}
        q_local, q_siam = ws.model.predictor(z["model"]), ws.siamese.predictor(z["siamese"])
        logits = ws.model.head(z["model"])
    one = {"has_hist": torch.tensor(1.0, dtype=x.dtype)}
    # step 1, f': 1/2 D-(q_f'(z_f'), sg(z_local)), D- = -cos
    assert math.isclose(float(siamese.loss(ws, x, y, one).detach()), -0.5 * _cos_mean(q_siam, z["model"]),
                        rel_tol=1e-9)
    # step 2: CE + mu (D+(sg(z_hist), z_local) + 1/2 D-(q(z_local), sg(z_f'))), D+ = +cos
    expected = _ce(logits, y) + 0.3 * (_cos_mean(z["hist"], z["model"]) - 0.5 * _cos_mean(q_local, z["siamese"]))
    assert math.isclose(float(local.loss(ws, x, y, one).detach()), expected, rel_tol=1e-9)
    zero = {"has_hist": torch.tensor(0.0, dtype=x.dtype)}  # before the first snapshot: no history term
    expected0 = _ce(logits, y) + 0.3 * (-0.5 * _cos_mean(q_local, z["siamese"]))
    assert math.isclose(float(local.loss(ws, x, y, zero).detach()), expected0, rel_tol=1e-9)


def test_fedeccr_mixes_prototype_contrast_and_ce_with_alpha_one_minus_r_over_R():
    from autofl.losses import prototype_contrast

    sim = _sim("fedeccr", "fl.rounds=4", "method.tau=0.5")
    method, ws = sim.method, sim.workspace
    x, y = sim.data.x[:8], sim.data.y[:8]
    ws.eval()
    with torch.no_grad():
        f = ws.model.encoder(x)
        ce = _ce(ws.model.head(f), y)
        pc = float(prototype_contrast(f, y, sim.server_state.prototypes, sim.server_state.has_prototype, 0.5))
    flags = method.client_start(sim.global_state, {}, sim.server_state).flags  # the prototypes it downloads
    assert torch.equal(flags["protos"], sim.server_state.prototypes)
    for rnd, alpha in ((0, 1.0), (1, 0.75), (2, 0.5), (3, 0.25)):
        (stage,) = method.local_stages(rnd, sim.server_state)
        got = float(stage.updates[0].loss(ws, x, y, flags).detach())
        assert math.isclose(got, alpha * pc + (1 - alpha) * ce, rel_tol=1e-9), rnd


def test_fedeccr_calibration_retrains_only_the_head_by_plain_sgd_on_virtual_features():
    """USCC on a copy of the global model: the encoder and the global state stay; the head equals a
    hand-written replay of plain SGD (lr 0.01, batch 64, momentum 0 as FL-bench's CCVR) on the virtual
    features, with the linear head's CE gradient (softmax(z) - onehot(y)) x^T / B written out."""
    from autofl.features import encoded_class_stats
    from autofl.methods.fedeccr import CALIB_BATCH, CALIB_LR, merge_class_stats, sample_virtual_features
    from autofl.seeding import derived_seed

    sim = _sim("fedeccr", "method.M=50", "method.calib_epochs=2", "fl.momentum=0.9")
    method, d = sim.method, sim.data
    received = {k: v.clone() for k, v in sim.global_state.items()}
    calibrated = method.calibrate(sim.server_context(trained=True))  # after round 0: completed=1
    assert all(torch.equal(sim.global_state[k], received[k]) for k in received)  # a copy was corrected
    assert {k for k in received if not torch.equal(calibrated[k], received[k])} == {"head.0.weight", "head.0.bias"}

    model = sim.model  # the simulation's float64 model
    model.load_state_dict(received)
    merged = merge_class_stats([encoded_class_stats(model.encoder, d.x, d.y, split.train, d.num_classes,
                                                    with_cov=True) for split in d.clients])
    gen = torch.Generator().manual_seed(derived_seed(sim.exp.seed, 1, 0xCCF))
    feats, labels = sample_virtual_features(merged, 50, gen)
    assert len(labels) == 50 * int((merged.counts > 0).sum())
    w, b = received["head.0.weight"].clone(), received["head.0.bias"].clone()
    for _ in range(2):
        order = torch.randperm(len(labels), generator=gen)
        for start in range(0, len(labels), CALIB_BATCH):
            idx = order[start : start + CALIB_BATCH]
            x, y = feats[idx], labels[idx]
            err = torch.softmax(x @ w.T + b, dim=1) - torch.nn.functional.one_hot(y, w.shape[0]).to(x.dtype)
            w, b = w - CALIB_LR * err.T @ x / len(y), b - CALIB_LR * err.mean(0)
    torch.testing.assert_close(calibrated["head.0.weight"], w, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(calibrated["head.0.bias"], b, rtol=1e-9, atol=1e-12)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.3)


def test_fedproto_loss_is_ce_plus_lambda_times_prototype_distance_and_predicts_the_nearest_prototype():
    sim = _sim("fedproto", "method.lam=2.5")
    method, ws = sim.method, sim.workspace
    _randomize(ws.model, 7)
    x, y = sim.data.x[:8], sim.data.y[:8]
    ws.eval()
    with torch.no_grad():
        f = ws.model.encoder(x)
        ce = _ce(ws.model.head(f), y)
    flags: dict = {}
    (stage,) = method.local_stages(0, sim.server_state)
    (update,) = stage.updates
    assert update.trains == ("model.",)
    assert math.isclose(float(update.loss(ws, x, y, flags).detach()), ce, rel_tol=1e-9)  # no prototype yet: CE
    d = f.shape[1]
    protos = torch.randn(10, d, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    has = torch.ones(10, dtype=torch.bool)
    has[y[0]] = False  # a class without a global prototype adds 0
    server = method.State(prototypes=protos, has_prototype=has)
    dist = sum(float(((f[i] - protos[y[i]]) ** 2).sum()) for i in range(len(y)) if has[y[i]]) / len(y)
    flags = method.client_start(sim.global_state, {}, server).flags  # the prototypes it downloads
    assert torch.equal(flags["protos"], protos) and torch.equal(flags["has"], has)
    (stage,) = method.local_stages(1, server)
    assert math.isclose(float(stage.updates[0].loss(ws, x, y, flags).detach()), ce + 2.5 * dist, rel_tol=1e-9)
    method.params = method.Params(lam=2.5, distance="mse")  # PFLlib's nn.MSELoss: divided by the width
    (stage,) = method.local_stages(1, server)
    assert math.isclose(float(stage.updates[0].loss(ws, x, y, flags).detach()), ce + 2.5 * dist / d, rel_tol=1e-9)
    with torch.no_grad():
        pred = method.predict(ws.model, x, {}, server).argmax(1)
    for i in range(len(y)):
        nearest = min((k for k in range(10) if has[k]), key=lambda k: float(((f[i] - protos[k]) ** 2).sum()))
        assert int(pred[i]) == nearest


def test_fedrep_trains_the_head_alone_for_head_epochs_then_the_encoder_alone_on_ce():
    sim = _sim("fedrep", "method.head_epochs=3")
    method, ws = sim.method, sim.workspace
    head_stage, body_stage = method.local_stages(0, sim.server_state)
    assert head_stage.epochs == 3 and body_stage.epochs is None  # None: fl.local_epochs
    assert [u.trains for u in head_stage.updates] == [("model.head.",)]
    assert [u.trains for u in body_stage.updates] == [("model.encoder.", "model.projector.")]
    assert head_stage.updates[0].report == "head_loss" and body_stage.updates[0].report == "loss"
    _randomize(ws.model, 3)
    x, y = sim.data.x[:6], sim.data.y[:6]
    ws.eval()
    with torch.no_grad():
        ce = _ce(ws.model(x), y)
    # the head stage's loss takes the frozen encoder's outputs (its `inputs`), the body stage's the batch
    assert head_stage.inputs == "model.encoder" and body_stage.inputs is None
    with torch.no_grad():
        f = ws.model.encoder(x)
    assert math.isclose(float(head_stage.updates[0].loss(ws, f, y, {}).detach()), ce, rel_tol=1e-9)
    assert math.isclose(float(body_stage.updates[0].loss(ws, x, y, {}).detach()), ce, rel_tol=1e-9)
    assert sim.shared == [k for k in sim.model.state_dict() if not k.startswith("head.")]


def test_ditto_personal_loss_is_ce_plus_half_lambda_proximal_to_the_received_global_model():
    sim = _sim("ditto", "method.lam=0.6")
    method, ws = sim.method, sim.workspace
    _randomize(ws.model, 11)  # w and v differ from each other ...
    _randomize(ws.glob, 12)  # ... and from the received global model
    (stage,) = method.local_stages(0, sim.server_state)  # per batch: a step of w, then one of v
    global_update, personal = stage.updates
    method.params = method.Params(lam=0.6, personal_epochs=3)  # v alone for 3 epochs, then w
    personal_stage, global_stage = method.local_stages(0, sim.server_state)
    assert (personal_stage.epochs, global_stage.epochs) == (3, None)
    assert personal_stage.updates[0].trains == personal.trains and global_stage.updates[0].trains == global_update.trains
    assert personal.trains == ("model.personal.",) and personal.report == "personal_loss"
    assert global_update.trains == ("model.encoder.", "model.projector.", "model.head.")
    x, y = sim.data.x[:6], sim.data.y[:6]
    ws.eval()
    with torch.no_grad():
        v_logits, w_logits = ws.model.personal(x), ws.model(x)
        anchor = dict(ws.glob.named_parameters())
        prox = sum(float(((p - anchor[k]) ** 2).sum()) for k, p in ws.model.personal.named_parameters())
        own = sum(float(((p - anchor[k]) ** 2).sum()) for k, p in ws.model.named_parameters()
                  if not k.startswith("personal."))
    assert not math.isclose(prox, own, rel_tol=1e-6)  # the anchor is glob's, not w's
    for update in (personal, personal_stage.updates[0]):  # the same loss, stepped with w or alone
        assert math.isclose(float(update.loss(ws, x, y, {}).detach()), _ce(v_logits, y) + 0.3 * prox, rel_tol=1e-9)
    assert math.isclose(float(global_update.loss(ws, x, y, {}).detach()), _ce(w_logits, y), rel_tol=1e-9)
    assert torch.equal(method.predict(ws.model, x, {}, sim.server_state), v_logits)  # personal metrics use v
    assert not any(k.startswith("personal.") for k in sim.shared)  # only w goes up

"""Linear weights updated by one in-place product in the compiled whole step (accel/linear_probes.py).

The whole step runs here without torch.compile (`compiled.compiled` returns the function itself), so
the probing logic is checked in seconds: the executor with probes against the same executor without
(every metric and state, float64, uneven clients and plain SGD so the whole step runs), and which
weights each method's updates probe. The compiled runs, probes included, are compared with eager in
test_executor_equivalence.py (test_compiled_steps_equal_eager).
"""

from __future__ import annotations

import pytest
import torch

from autofl.accel import compiled, linear_probes, vectorized
from autofl.accel.linear_probes import LinearProbes, ProbedWeight, linear_sgd_, proximal_sgd_

PLAIN_SGD = ("fl.momentum=0", "fl.weight_decay=0")


def test_linear_sgd_is_sgd_on_each_clients_weight_gradient():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    out_grads = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    inputs = torch.randn(3, 2, 5, generator=g, dtype=torch.float64)
    lr = torch.tensor(0.1, dtype=torch.float64)
    expected = torch.stack([weight[k] - 0.1 * out_grads[k].T @ inputs[k] for k in range(3)])
    same_memory = weight.data_ptr()
    linear_sgd_(weight, out_grads, inputs, lr)
    torch.testing.assert_close(weight, expected, rtol=0, atol=1e-12)
    assert weight.data_ptr() == same_memory


def test_proximal_sgd_is_sgd_on_each_clients_proximal_term():
    """coef[k] * ||w_k - anchor||^2 has gradient 2 coef[k] (w_k - anchor): one SGD step of it, in place,
    with the anchor shared by the clients (an expanded view, as the step passes it)."""
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    anchor = torch.randn(4, 5, generator=g, dtype=torch.float64)
    coef = torch.tensor([0.005, 0.0, 0.5], dtype=torch.float64)
    lr = torch.tensor(0.1, dtype=torch.float64)
    expected = torch.stack([weight[k] - 0.1 * 2 * coef[k] * (weight[k] - anchor) for k in range(3)])
    same_memory = weight.data_ptr()
    proximal_sgd_(weight, anchor.expand(3, 4, 5), coef, lr)
    torch.testing.assert_close(weight, expected, rtol=0, atol=1e-12)
    assert weight.data_ptr() == same_memory


def _eager_whole_steps(monkeypatch) -> None:
    """runtime.compile=on without torch.compile: the executor takes its compiled paths eagerly."""
    monkeypatch.setattr(compiled, "compiled", lambda fn, key, device, options=None: fn)


@pytest.fixture(autouse=True)
def probe_small_weights(monkeypatch):
    """The digits MLP's weights (64 x 100) are below MIN_PROBED_WEIGHT: probe every size here."""
    monkeypatch.setattr(linear_probes, "MIN_PROBED_WEIGHT", 0)


def _run(method: str, probes: bool):
    from test_executor_equivalence import run

    with pytest.MonkeyPatch.context() as patch:
        _eager_whole_steps(patch)
        if not probes:
            patch.setattr(vectorized, "probe_plan", lambda *args, **kwargs: ())
        return run(method, "mlp", "vectorized", "float64", "on", PLAIN_SGD)


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "moon", "dualfed", "ditto", "fedsiam_da", "fedfcd"])
def test_probed_whole_step_equals_autograds(method, monkeypatch):
    """The same run with the linear weights' updates by `linear_sgd_` and with autograd's weight
    gradients and torch's SGD: one update a step (fedavg; fedprox, its proximal terms by `proximal_sgd_`;
    moon through a BatchNorm projector; dualfed's
    two stages, the second reading the encoder under no_grad) and several in one call (ditto's w then
    v, fedsiam_da, fedfcd)."""
    from conftest import spy_whole_steps
    from test_executor_equivalence import assert_same_run

    plain_history, plain = _run(method, probes=False)
    one, together = spy_whole_steps(monkeypatch, vectorized._Step), spy_whole_steps(monkeypatch, vectorized._StageStep)
    probed_history, probed = _run(method, probes=True)
    # the whole step ran, also with clients past their last batch
    assert any(hi < k for hi, k, _ in one + together)
    plans = LinearProbes.of(probed.workspace).plans
    assert any(plan for plan in plans.values())
    assert_same_run(plain_history, plain, probed_history, probed)


def test_probe_plans_take_the_weights_read_only_through_linear_calls_and_proximal_terms(monkeypatch):
    """fedavg: both layers' weights (one call each, a batch of 32 rows); fedprox: both, with their
    proximal terms (the loss's terms 0 and 2 of four: weight, bias, weight, bias); ditto: w's weights,
    and v's with their proximal terms; dualfed: stage 2 probes the global head only (the encoder runs
    under no_grad there). Weights below MIN_PROBED_WEIGHT elements are never probed (0 in this file;
    the digits MLP's weights are 6,400)."""
    plans = {}
    for method in ("fedavg", "fedprox", "ditto", "dualfed"):
        _, sim = _run(method, probes=True)
        plans[method] = {key[2:]: plan for key, plan in LinearProbes.of(sim.workspace).plans.items()}
    assert plans["fedavg"] == {(0, 0): (ProbedWeight("model.encoder.1.weight", ((32, 100),)),
                                        ProbedWeight("model.head.0.weight", ((32, 10),)))}
    assert plans["fedprox"] == {(0, 0): (ProbedWeight("model.encoder.1.weight", ((32, 100),), (0,)),
                                         ProbedWeight("model.head.0.weight", ((32, 10),), (2,)))}
    assert plans["ditto"] == {(0, 0): (ProbedWeight("model.encoder.1.weight", ((32, 100),)),
                                       ProbedWeight("model.head.0.weight", ((32, 10),))),
                              (0, 1): (ProbedWeight("model.personal.encoder.1.weight", ((32, 100),), (0,)),
                                       ProbedWeight("model.personal.head.0.weight", ((32, 10),), (2,)))}
    stage2 = plans["dualfed"][(1, 0)]
    assert [w.name for w in stage2] == ["model.global_head.0.weight"]
    assert all(w.name.startswith(("model.encoder.", "model.projector.", "model.head.")) and not w.pulls
               for w in plans["dualfed"][(0, 0)])
    monkeypatch.setattr(linear_probes, "MIN_PROBED_WEIGHT", 6401)
    _, sim = _run("fedavg", probes=True)
    assert list(LinearProbes.of(sim.workspace).plans.values()) == [()]


def test_a_probed_step_stopped_by_an_error_leaves_no_probe_set(monkeypatch):
    """An exception inside a probed step (here FedProx's proximal distance failing once the step runs,
    after probe_plan's two looks) propagates, and no probe stays set for a later loss in the process."""
    from autofl import losses

    original, calls, made = losses.squared_distance, [], []
    original_of = LinearProbes.of.__func__

    def recorded_of(cls, ws):
        probes = original_of(cls, ws)
        made.append(probes)
        return probes

    def failing_in_the_step(p, anchor):
        if any(probes.running for probes in made):
            calls.append(1)
            if len(calls) > 8:  # probe_plan's two looks make 4 terms each
                raise RuntimeError("stopped inside the step")
        return original(p, anchor)

    monkeypatch.setattr(LinearProbes, "of", classmethod(recorded_of))
    monkeypatch.setattr(losses, "squared_distance", failing_in_the_step)
    with pytest.raises(RuntimeError, match="stopped inside the step"):
        _run("fedprox", probes=True)
    assert made and not any(probes.running for probes in made)
    assert len(calls) == 9


def test_a_probed_module_still_copies_and_pickles_and_is_unchanged_outside_a_step():
    import copy
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    before = model(x)
    LinearProbes.of(model).hook(model[0], "0.weight")
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # no probed step running: the hook passes
    restored = pickle.loads(pickle.dumps(copy.deepcopy(model)))
    torch.testing.assert_close(restored(x), before, rtol=0, atol=0)

"""Each loss term against a value computed by hand on fixed small tensors."""

import math

import torch

from autofl.losses import contrastive_pair, negative_cosine, prototype_contrast, supcon
from autofl.methods.fdcl import fdcl_terms
from autofl.methods.fedfcd import gfr_regularizer

T = torch.tensor


def test_moon_term():
    # cos(z, z_g) = 1, cos(z, z_prev) = 0, tau = 0.5
    got = contrastive_pair(T([[1.0, 0.0]]), T([[2.0, 0.0]]), T([[0.0, 3.0]]), 0.5)
    assert math.isclose(got.item(), -math.log(math.e**2 / (math.e**2 + 1)), rel_tol=1e-6)


def test_fdcl_encoder_and_classifier_terms():
    tau = 0.5
    pe = (T([[1.0, 0.0]]), T([[1.0, 1.0]]), T([[0.0, 1.0]]))  # local, global, previous
    pc = (T([[1.0, 0.0, 0.0]]), T([[0.0, 0.0, 1.0]]), T([[2.0, 0.0, 0.0]]))
    l_e, l_c = fdcl_terms(pe, pc, tau)
    c = 1 / math.sqrt(2)  # cos(Pe_l, Pe_g); cos(Pe_l, Pe_p) = 0
    assert math.isclose(l_e.item(), -math.log(math.exp(c / tau) / (math.exp(c / tau) + 1)), rel_tol=1e-6)
    # l_c's positive is the previous model: cos(Pc_l, Pc_p) = 1, cos(Pc_l, Pc_g) = 0
    assert math.isclose(l_c.item(), -math.log(math.exp(1 / tau) / (1 + math.exp(1 / tau))), rel_tol=1e-6)


def test_fedeccr_prototype_contrast_skips_missing_prototypes():
    protos = T([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    has = torch.tensor([True, True, False])
    f = T([[1.0, 0.0], [1.0, 1.0]])
    y = torch.tensor([0, 2])  # second sample's class has no prototype: contributes 0
    tau = 0.5
    got = prototype_contrast(f, y, protos, has, tau)
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0))) / 2
    assert math.isclose(got.item(), expected, rel_tol=1e-6)


def test_supcon_with_positives():
    z = T([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 0, 1])
    tau = 1.0
    # anchors 0 and 1: one positive (dot 1), denominator e^1 + e^0; anchor 2 has no positive: 0
    per = -(1 - math.log(math.e + 1)) / (1 + 1e-6)
    assert math.isclose(supcon(z, y, tau).item(), 2 * per / 3, rel_tol=1e-6)


def test_supcon_without_positives_is_zero():
    z = torch.nn.functional.normalize(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), dim=1)
    assert supcon(z, torch.arange(4), 0.1).item() == 0.0


def test_fedsiam_da_terms():
    p, z = T([[1.0, 0.0]]), T([[1.0, 1.0]])
    assert math.isclose(negative_cosine(p, z).item(), -1 / math.sqrt(2), rel_tol=1e-6)  # D-
    d_plus = torch.nn.functional.cosine_similarity(p, z, dim=1).mean()  # D+ as used in the local loss
    assert math.isclose(d_plus.item(), 1 / math.sqrt(2), rel_tol=1e-6)


def test_fedfcd_regularizer():
    f = T([[1.0, 2.0], [3.0, 4.0]])
    gfr = T([[0.0, 0.0], [9.0, 9.0]])
    has = torch.tensor([True, False])
    # sample 0: ||(1,2)||^2 / d = 5/2; sample 1: its class has no GFR -> 0; mean over the batch of 2
    assert math.isclose(gfr_regularizer(f, torch.tensor([0, 1]), gfr, has).item(), 1.25, rel_tol=1e-6)

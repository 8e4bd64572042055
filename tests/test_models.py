import pytest
import torch
from torch import nn

from autofl.config import ModelConfig
from autofl.models.parts import build_model


def _linears(module):
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("arch,shape,total", [("mlp", (1, 8, 8), 2), ("cnn", (1, 28, 28), 2),
                                              ("moon_cnn", (3, 32, 32), 5)])
def test_head_layers_moves_the_split_point_without_changing_capacity(arch, shape, total):
    sizes = set()
    for h in range(1, total + 1):
        model = build_model(ModelConfig(arch=arch, head_layers=h), shape, 10)
        assert len(_linears(model.head)) == h
        assert len(_linears(model.encoder)) == total - h
        feats = model.encoder(torch.zeros(2, *shape))
        assert feats.shape == (2, model.feature_dim)
        assert model(torch.zeros(2, *shape)).shape == (2, 10)
        sizes.add(sum(p.numel() for p in model.parameters()))
    assert len(sizes) == 1


def test_cnn_flat_features_follow_the_spec():
    model = build_model(ModelConfig(arch="cnn", head_layers=2), (1, 28, 28), 10)
    assert _linears(model.head)[0].in_features == 1024
    model = build_model(ModelConfig(arch="cnn", head_layers=2), (3, 32, 32), 10)
    assert _linears(model.head)[0].in_features == 1600


@pytest.mark.parametrize("depth,expected", [(1, [(100, 100)]), (2, [(100, 64), (64, 100)]),
                                            (3, [(100, 64), (64, 64), (64, 100)])])
def test_projector_depth_and_dim(depth, expected):
    model = build_model(ModelConfig(projector_depth=depth, projector_dim=64), (1, 8, 8), 10)
    assert [(m.in_features, m.out_features) for m in _linears(model.projector)] == expected
    assert sum(isinstance(m, nn.BatchNorm1d) for m in model.projector.modules()) == depth
    assert model(torch.zeros(4, 1, 8, 8)).shape == (4, 10)


def test_no_projector_at_depth_zero():
    model = build_model(ModelConfig(), (1, 8, 8), 10)
    assert isinstance(model.projector, nn.Identity)


def test_resnet18_has_cifar_stem():
    model = build_model(ModelConfig(arch="resnet18"), (3, 32, 32), 10)
    stem = model.encoder[0].conv1
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert isinstance(model.encoder[0].maxpool, nn.Identity)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)

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


@pytest.mark.parametrize("depth,hidden,expected", [(1, 64, [(100, 256)]), (2, 64, [(100, 64), (64, 256)])])
def test_a_method_can_fix_the_projector_output_and_the_head_reads_it(depth, hidden, expected):
    model = build_model(ModelConfig(projector_depth=depth, projector_dim=hidden), (1, 8, 8), 10, projector_out=256)
    assert [(m.in_features, m.out_features) for m in _linears(model.projector)] == expected
    assert (model.feature_dim, model.embed_dim) == (100, 256)
    assert _linears(model.head)[0].in_features == 256
    assert model(torch.zeros(4, 1, 8, 8)).shape == (4, 10)


def test_fedsiam_da_projects_to_256_and_its_predictor_is_256_64_256_whatever_the_encoder_width():
    from autofl.engine.simulation import Simulation
    from autofl.methods.registry import get_method_class
    from autofl.experiment import load_experiment

    for arch, width in (("mlp", 100), ("resnet18", 512)):
        exp = load_experiment(None, ["method.name=fedsiam_da", f"model.arch={arch}", "model.head_layers=1",
                                     "model.projector_dim=128", "data.num_clients=2", "fl.rounds=1"])
        model = Simulation(exp, get_method_class(exp.method.name)).method.build_model()
        assert model.feature_dim == width
        assert [(m.in_features, m.out_features) for m in _linears(model.projector)] == [(width, 128), (128, 256)]
        assert [(m.in_features, m.out_features, m.bias is not None) for m in _linears(model.predictor)] == \
            [(256, 64, False), (64, 256, True)]
        assert _linears(model.head)[0].in_features == 256

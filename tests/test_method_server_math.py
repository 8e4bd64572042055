import torch

from autofl.features import class_stats
from autofl.methods.fedeccr import merge_class_stats
from autofl.methods.fedfcd import global_feature_representations
from autofl.methods.fedsiam_da import dual_weights


def test_fedeccr_merged_mean_and_covariance_equal_pooled():
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(n, 4, generator=g, dtype=torch.float64) * (i + 1) + i for i, n in enumerate([7, 12, 1, 30])]
    labels = [torch.randint(0, 3, (len(f),), generator=g) for f in feats]
    merged = merge_class_stats([class_stats(f, y, 3, with_cov=True) for f, y in zip(feats, labels)])
    pooled_f, pooled_y = torch.cat(feats), torch.cat(labels)
    for k in range(3):
        fk = pooled_f[pooled_y == k]
        assert int(merged.counts[k]) == len(fk)
        torch.testing.assert_close(merged.means[k], fk.mean(0), atol=1e-5, rtol=0)
        torch.testing.assert_close(merged.covs[k], torch.cov(fk.T), atol=1e-5, rtol=0)


def test_fedsiam_da_xi_weights():
    states = [{"w": torch.tensor([1.0, 0.0]), "running_mean": torch.tensor([100.0])},
              {"w": torch.tensor([0.0, 1.0]), "running_mean": torch.tensor([-100.0])},
              {"w": torch.tensor([1.0, 1.0]), "running_mean": torch.tensor([0.0])}]
    xi = dual_weights(states, ["w"])  # BN buffers excluded
    w0 = torch.tensor([2 / 3, 2 / 3])
    d = [torch.nn.functional.cosine_similarity(s["w"], w0, dim=0).item() for s in states]
    assert abs(sum(xi) - 1) < 1e-9
    for got, dk in zip(xi, d):
        assert abs(got - dk / sum(d)) < 1e-6  # reference computed in float32
    assert abs(xi[2] - 1 / (1 + 2 / 2**0.5)) < 1e-9  # hand value: D = (1/sqrt2, 1/sqrt2, 1)


def test_fedfcd_gfr_is_size_weighted_mean():
    a = class_stats(torch.tensor([[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]), torch.tensor([0, 0, 1]), 3)
    b = class_stats(torch.tensor([[4.0, 8.0]]), torch.tensor([0]), 3)
    gfr, has = global_feature_representations([a, b])
    # class 0: client a mean (1,1) with 2 samples, client b (4,8) with 1 -> (2/3)(1,1) + (1/3)(4,8)
    torch.testing.assert_close(gfr[0], torch.tensor([2.0, 10 / 3]))
    torch.testing.assert_close(gfr[1], torch.tensor([4.0, 4.0]))
    assert has.tolist() == [True, True, False]

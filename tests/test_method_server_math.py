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


def test_fedproto_global_prototypes_are_the_size_weighted_class_means_of_the_uploads():
    from autofl.methods.fedproto import global_prototypes

    a = class_stats(torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 6.0]]), torch.tensor([0, 0, 2]), 3)
    b = class_stats(torch.tensor([[7.0, 3.0], [1.0, 1.0], [1.0, 3.0]]), torch.tensor([0, 2, 2]), 3)
    protos, has = global_prototypes([a, b])
    # class 0: a's mean (2,0) over 2 samples, b's (7,3) over 1 -> (2/3)(2,0) + (1/3)(7,3) = (11/3, 1)
    torch.testing.assert_close(protos[0], torch.tensor([11 / 3, 1.0]))
    # class 2: a's (0,6) over 1, b's (1,2) over 2 -> (1/3)(0,6) + (2/3)(1,2) = (2/3, 10/3)
    torch.testing.assert_close(protos[2], torch.tensor([2 / 3, 10 / 3]))
    assert has.tolist() == [True, False, True]  # nobody holds class 1: no prototype


def test_fedgh_server_trains_the_global_head_by_plain_sgd_on_the_uploaded_class_means():
    """The global head equals a hand-written replay of SGD (CE gradient of a linear head written
    out) over every (class mean, class) pair of this round's uploads, shuffled each epoch."""
    from autofl.methods.fedgh import train_global_head

    g = torch.Generator().manual_seed(3)
    local = [class_stats(torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g), 3)
             for n in (5, 9, 2)]
    head = torch.nn.Linear(4, 3).double()
    w, b = head.weight.detach().clone(), head.bias.detach().clone()
    new = train_global_head(head, local, lr=0.2, epochs=3, batch_size=2, generator=torch.Generator().manual_seed(11))
    feats = torch.cat([s.means[s.counts > 0] for s in local])
    labels = torch.cat([torch.nonzero(s.counts > 0).flatten() for s in local])
    assert len(labels) == sum(int((s.counts > 0).sum()) for s in local)
    gen = torch.Generator().manual_seed(11)
    for _ in range(3):
        order = torch.randperm(len(labels), generator=gen)
        for start in range(0, len(labels), 2):
            idx = order[start : start + 2]
            x, y = feats[idx], labels[idx]
            err = torch.softmax(x @ w.T + b, dim=1) - torch.nn.functional.one_hot(y, 3).to(x.dtype)
            w, b = w - 0.2 * err.T @ x / len(y), b - 0.2 * err.mean(0)
    torch.testing.assert_close(new["weight"], w, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(new["bias"], b, rtol=1e-9, atol=1e-12)

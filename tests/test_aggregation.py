import torch

from autofl.engine.state import weighted_average


def test_weighted_average_equals_weighted_mean():
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)} for _ in range(3)]
    weights = [10, 30, 60]
    out = weighted_average(states, weights)
    for key in ("w", "b"):
        expected = sum(w * s[key] for w, s in zip(weights, states)) / 100
        torch.testing.assert_close(out[key], expected)


def test_integer_buffers_stay_integers():
    states = [{"n": torch.tensor(3)}, {"n": torch.tensor(5)}]
    out = weighted_average(states, [1, 1])
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 4

"""The embedded digits loader reads scikit-learn's bundled file without importing scikit-learn."""

import numpy as np
import torch

from autofl.config import DataConfig
from autofl.data.datasets import load_raw_dataset


def test_digits_equals_scikit_learn_load_digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    raw = load_raw_dataset(DataConfig(dataset="digits"))
    x = torch.cat([raw.train_x, raw.test_x])
    y = torch.cat([raw.train_y, raw.test_y])
    assert len(y) == len(bunch.target) == 1797
    expected = (torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0 - 0.3) / 0.4
    # the split is a fixed permutation: match every sample of ours to sklearn's by content
    ours = {(tuple(xi.flatten().tolist()), int(yi)) for xi, yi in zip(x, y)}
    theirs = {(tuple(xi.flatten().tolist()), int(yi)) for xi, yi in zip(expected, torch.tensor(bunch.target))}
    assert ours == theirs
    assert np.bincount(y.numpy()).tolist() == np.bincount(bunch.target).tolist()

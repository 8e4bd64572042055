"""Synthetic(1, 1) of FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks",
arXiv:1812.06127, section 5.1): 30 clients, 60 features, 10 classes; client k draws
W_k ~ N(u_k, 1), b_k ~ N(u_k, 1) with u_k ~ N(0, alpha), features x ~ N(v_k, Sigma) with
v_k ~ N(B_k, 1), B_k ~ N(0, beta), Sigma = diag(j^-1.2), labels y = argmax softmax(W_k x + b_k);
client sizes follow a power law (lognormal(4, 2) + 50, as the FedProx generator). Each client
keeps 90% of its samples for training and 10% for testing, as FedProx does. A fixed seed makes it
the same dataset everywhere; the client ids are its natural partition (`data.partition.kind: natural`).
"""

import numpy as np
import torch

from autofl.data.spec import DatasetSpec, RawDataset

CLIENTS, FEATURES, CLASSES, ALPHA, BETA, SEED = 30, 60, 10, 1.0, 1.0, 0
MAX_PER_CLIENT = 2000  # the lognormal tail is cut so the dataset stays small


def generate(seed: int = SEED) -> RawDataset:
    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.lognormal(4, 2, CLIENTS).astype(int) + 50, MAX_PER_CLIENT)
    u = rng.normal(0, ALPHA, CLIENTS)
    b_shift = rng.normal(0, BETA, CLIENTS)
    cov = np.diag(np.arange(1, FEATURES + 1, dtype=float) ** -1.2)
    parts = {"train": ([], [], []), "test": ([], [], [])}
    for k in range(CLIENTS):
        w = rng.normal(u[k], 1, (FEATURES, CLASSES))
        b = rng.normal(u[k], 1, CLASSES)
        x = rng.multivariate_normal(rng.normal(b_shift[k], 1, FEATURES), cov, sizes[k])
        y = np.argmax(x @ w + b, axis=1)  # softmax keeps the argmax
        n_train = int(0.9 * sizes[k])
        for split, rows in (("train", slice(0, n_train)), ("test", slice(n_train, None))):
            parts[split][0].append(x[rows])
            parts[split][1].append(y[rows])
            parts[split][2].append(np.full(len(y[rows]), k))

    def tensors(split: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y, c = (np.concatenate(a) for a in parts[split])
        return (torch.tensor(x, dtype=torch.float32).view(-1, 1, 1, FEATURES), torch.tensor(y, dtype=torch.int64),
                torch.tensor(c, dtype=torch.int64))

    (tx, ty, tc), (vx, vy, vc) = tensors("train"), tensors("test")
    return RawDataset("synthetic_1_1", tx, ty, vx, vy, CLASSES, train_client=tc, test_client=vc)


SYNTHETIC_1_1 = DatasetSpec(
    "synthetic_1_1", lambda cfg: generate(), num_classes=CLASSES, input_shape=(1, 1, FEATURES),
    natural_clients=CLIENTS, description="FedProx's Synthetic(1,1): 30 clients, 60 features, generated (seed 0)",
)

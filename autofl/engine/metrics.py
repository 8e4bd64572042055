"""Round metrics (spec §1): personal accuracy per client, global accuracy, their summaries."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from autofl.data.federated import ClientSplit, FederatedData
from autofl.engine.harm import HarmReference, client_accuracies, harmed_metrics
from autofl.engine.newcomers import Newcomer
from autofl.engine.server import MethodHooks, ServerState
from autofl.engine.state import StateDict
from autofl.models.parts import SplitModel


class Evaluated(Protocol):
    """What `evaluate` reads of a run (autofl.engine.simulation.Simulation has it all): the method, a
    model of its layout to load states into, the data, the global state, each client's own state and
    the method's server state."""

    method: MethodHooks
    model: SplitModel
    data: FederatedData
    global_state: StateDict
    client_states: dict[int, dict[str, Any]]
    server_state: ServerState


def eval_batch(device: torch.device) -> int:
    """Rows per no-grad forward: large batches feed a GPU; on CPU, batches past a few hundred rows
    fall out of cache (a 2048-row cnn pass ran 2x slower per sample than a 256-row one)."""
    return 2048 if device.type == "cuda" else 256


@torch.no_grad()
def count_correct(predict: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> int:
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    step = eval_batch(x.device)
    for start in range(0, len(y), step):
        logits = predict(x[start : start + step])
        correct += (logits.argmax(dim=1) == y[start : start + step]).sum()
    return int(correct)


def _per_client(name: str, correct: list[int], sizes: list[int]) -> dict[str, float]:
    """Per-client accuracies (clients holding samples of that split) summarized: `<name>_unweighted`
    (their mean, every client counted once: pFL-Bench's unweighted mean), `<name>_std` (population
    std) and `<name>_p10`, the 10th percentile (the worst-decile client, a fairness objective)."""
    acc = np.array([c / n for c, n in zip(correct, sizes) if n > 0])  # evaluate() calls it for splits with samples
    return {
        f"{name}_unweighted": float(acc.mean()),
        f"{name}_std": float(acc.std()),
        f"{name}_p10": float(np.percentile(acc, 10)),
    }


@torch.no_grad()
def personal_counts(
    sim: Evaluated, splits: list[ClientSplit], states: list[dict[str, Any]], newcomers: list[Newcomer] | None = None
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Correct predictions of each client's personal model (its state beside its split; a held-out
    client's from `newcomers`) on its val and test split, and the splits' sizes: (val_correct,
    test_correct, val_sizes, test_sizes)."""
    method, model, data, server = sim.method, sim.model, sim.data, sim.server_state
    model.eval()
    val_correct, test_correct = [], []
    loaded_global = False
    for k, (split, state) in enumerate(zip(splits, states)):
        if newcomers is not None:
            method.load_newcomer(model, newcomers[k].trained, state, server)
            model.eval()
        elif not (method.personal_is_global and loaded_global):
            method.load_personal(model, sim.global_state, state, server)
            loaded_global = method.personal_is_global
        predict = lambda x, s=state: method.predict(model, x, s, server)  # noqa: E731
        val_correct.append(count_correct(predict, *data.rows(split.val)))
        test_correct.append(count_correct(predict, *data.rows(split.test)))
    return val_correct, test_correct, [len(s.val) for s in splits], [len(s.test) for s in splits]


@dataclass(frozen=True)
class ClientCounts:
    """Each training client's personal model on its own splits, in client order: correct predictions
    and split sizes (what every summary of a round is made of: the weighted mean, p10, any subset of
    clients or resampled validation set a benchmark replays)."""

    val_correct: list[int]
    test_correct: list[int]
    val_sizes: list[int]
    test_sizes: list[int]
    unseen: ClientCounts | None = None  # the held-out clients' (data.holdout_clients), after newcomer training


@torch.no_grad()
def evaluate(
    sim: Evaluated, newcomers: list[Newcomer] | None = None, harm: HarmReference | None = None
) -> dict[str, float]:
    """A round's metrics. `newcomers`: the held-out clients after their newcomer training
    (autofl.engine.newcomers), for the unseen_* metrics and the participation gap; `harm`: the
    per-client references of harmed_frac and harmed_vs_global (autofl.engine.harm)."""
    return evaluate_with_counts(sim, newcomers, harm)[0]


@torch.no_grad()
def evaluate_with_counts(
    sim: Evaluated,
    newcomers: list[Newcomer] | None = None,
    harm: HarmReference | None = None,
    global_metrics: bool = True,
) -> tuple[dict[str, float], ClientCounts]:
    """`evaluate`'s metrics and the training clients' counts they summarize; without `global_metrics`
    (eval.global_metrics false) no global_* metric."""
    method, model, data, server = sim.method, sim.model, sim.data, sim.server_state
    states = [sim.client_states.get(cid, {}) for cid in range(len(data.clients))]
    val_correct, test_correct, val_sizes, test_sizes = personal_counts(sim, data.clients, states)
    counts = ClientCounts(val_correct, test_correct, val_sizes, test_sizes)
    # a split with no samples (data.split.val: 0 or test: 0) has no accuracy: its keys are left out,
    # as the global ones are for methods without a global model, rather than reported as 0.0
    out: dict[str, float] = {}
    if sum(val_sizes):
        out["personal_val_acc"] = sum(val_correct) / sum(val_sizes)
        out.update(_per_client("personal_val_acc", val_correct, val_sizes))
    if sum(test_sizes):
        out["personal_test_acc"] = sum(test_correct) / sum(test_sizes)
        out.update(_per_client("personal_test_acc", test_correct, test_sizes))
        if harm is not None:
            out.update(harmed_metrics(client_accuracies(test_correct, test_sizes), harm))
    if data.newcomers and newcomers:
        val_correct, test_correct, val_sizes, test_sizes = personal_counts(
            sim, data.newcomers, [n.state for n in newcomers], newcomers
        )
        counts = dataclasses.replace(counts, unseen=ClientCounts(val_correct, test_correct, val_sizes, test_sizes))
        if sum(val_sizes):
            out["unseen_val_acc"] = sum(val_correct) / sum(val_sizes)
        if sum(test_sizes):
            out["unseen_test_acc"] = sum(test_correct) / sum(test_sizes)
            if "personal_test_acc" in out:  # what a client gains by taking part in training
                out["participation_gap"] = out["personal_test_acc"] - out["unseen_test_acc"]
    if method.has_global_model and global_metrics:
        method.load_global(model, sim.global_state, server)
        predict_global = lambda x: method.predict_global(model, x, server)  # noqa: E731
        val_x, val_y = data.all_val_rows()
        if len(val_y):
            out["global_val_acc"] = count_correct(predict_global, val_x, val_y) / len(val_y)
        if len(data.test_y):
            out["global_test_acc"] = count_correct(predict_global, data.test_x, data.test_y) / len(data.test_y)
    return out, counts


@torch.no_grad()
def client_test_accuracies(sim: Evaluated, global_model: bool) -> list[float | None]:
    """Each training client's accuracy on its own test split: of its personal model, or (with
    `global_model`) of the method's global model (None for a client without test samples)."""
    method, model, data, server = sim.method, sim.model, sim.data, sim.server_state
    if not global_model:
        states = [sim.client_states.get(cid, {}) for cid in range(len(data.clients))]
        _, test_correct, _, test_sizes = personal_counts(sim, data.clients, states)
        return client_accuracies(test_correct, test_sizes)
    method.load_global(model, sim.global_state, server)
    model.eval()
    predict = lambda x: method.predict_global(model, x, server)  # noqa: E731
    correct = [count_correct(predict, *data.rows(c.test)) for c in data.clients]
    return client_accuracies(correct, [len(c.test) for c in data.clients])

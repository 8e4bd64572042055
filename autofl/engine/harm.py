"""Harmed clients (Motley; issue 40 item 2): the share of clients a run leaves worse off than a
reference, compared client by client on their own test split. References (autofl.harm_references
computes them): each client's accuracy training alone (the `local` method) and the FedAvg global
model's accuracy on the client's test split, at the last round of the same partition and seed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HarmReference:
    """Per training client (in the simulation's order), its test accuracy under each reference;
    None for a client without test samples."""

    local: list[float | None]
    global_model: list[float | None]

    def to_json(self) -> dict[str, list[float | None]]:
        return {"local": self.local, "global_model": self.global_model}

    @classmethod
    def from_json(cls, data: dict[str, list[float | None]]) -> HarmReference:
        return cls(list(data["local"]), list(data["global_model"]))


def client_accuracies(correct: list[int], sizes: list[int]) -> list[float | None]:
    return [c / n if n else None for c, n in zip(correct, sizes)]


def harmed_metrics(accuracy: list[float | None], reference: HarmReference) -> dict[str, float]:
    """`harmed_frac`: the share of clients (with test samples) whose personal test accuracy is below
    their own training alone; `harmed_vs_global`: below the FedAvg global model on their data. A
    client the reference does not know (another number of clients) makes the reference not apply:
    no keys then."""
    if len(reference.local) != len(accuracy) or len(reference.global_model) != len(accuracy):
        return {}
    out: dict[str, float] = {}
    for key, ref in (("harmed_frac", reference.local), ("harmed_vs_global", reference.global_model)):
        pairs = [(a, r) for a, r in zip(accuracy, ref) if a is not None and r is not None]
        if pairs:
            out[key] = sum(a < r for a, r in pairs) / len(pairs)
    return out

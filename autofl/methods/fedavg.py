"""FedAvg: everything shared, plain local SGD, size-weighted averaging (the base defaults)."""

from autofl.methods.base import Method
from autofl.methods.registry import register


@register
class FedAvg(Method):
    name = "fedavg"
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

"""FedPer: the head stays private on each client, the rest is averaged."""

from autofl.methods.base import Method, Sharing
from autofl.methods.registry import register


@register
class FedPer(Method):
    name = "fedper"
    sharing = Sharing(local=("head.*",))  # the head stays on its client
    has_global_model = False  # the server never trains a head
    personal_is_global = False
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

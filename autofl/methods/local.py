"""Local: each client trains alone on its own data, nothing is communicated (the "local only"
baseline of pFL papers, and the reference `harmed_frac` compares against)."""

from autofl.methods.base import Method, Sharing
from autofl.methods.registry import register


@register
class Local(Method):
    name = "local"
    sharing = Sharing(local=("*",))  # every tensor stays on its client: nothing uploaded, nothing averaged
    has_global_model = False  # the server never trains anything
    personal_is_global = False
    population_ready = True
    same_steps_every_round = True  # round and server state reach its losses only as flags

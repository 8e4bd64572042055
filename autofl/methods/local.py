"""Local: each client trains alone on its own data, nothing is communicated (the "local only"
baseline of pFL papers, and the reference `harmed_frac` compares against)."""

from autofl.methods.base import Method
from autofl.methods.registry import register
from autofl.models.parts import SplitModel


@register
class Local(Method):
    name = "local"
    has_global_model = False  # the server never trains anything
    personal_is_global = False
    population_ready = True

    def shared_keys(self, model: SplitModel) -> list[str]:
        return []  # every tensor stays on its client: nothing uploaded, nothing averaged

"""FedPer: the head stays private on each client, the rest is averaged."""

from autofl.methods.base import Method
from autofl.methods.registry import register
from autofl.models.parts import SplitModel


@register
class FedPer(Method):
    name = "fedper"
    has_global_model = False  # the server never trains a head
    personal_is_global = False
    population_ready = True

    def shared_keys(self, model: SplitModel) -> list[str]:
        return [k for k in model.state_dict() if not k.startswith("head.")]

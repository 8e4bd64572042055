"""LG-FedAvg (Liang et al. 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", arXiv:2001.01523): each client keeps its own local representation (the
encoder and projector, never sent) and the server averages only the global layers on top of it
(the head). The opposite split of FedPer; `model.head_layers` sets how many layers are global."""

from autofl.methods.base import Method, Sharing


class LGFedAvg(Method):
    name = "lg_fedavg"
    has_global_model = False  # no global representation exists, so no global model to evaluate
    personal_is_global = False
    population_ready = True  # its local step is FedAvg's and reads no per-config value: configs can train as one

    sharing = Sharing(local=("encoder.*", "projector.*"))  # only the head (the global layers) is uploaded and averaged

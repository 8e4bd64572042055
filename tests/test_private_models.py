"""A personal model the client keeps is one declaration (`Method.private_models`); a trained
workspace copy that nothing keeps is a one-line error, not weights silently dropped every round.

The toy method is APFL-like (Deng et al. 2020): a global model w trained by FedAvg and a private
local model v trained on the mixture alpha * v(x) + (1 - alpha) * w(x); the personal prediction is
that mixture."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autofl.engine.simulation import Simulation
from autofl.errors import MethodDefinitionError
from autofl.experiment import load_experiment
from autofl.methods.base import ClientStart, Method, Stage, Update

ALPHA = 0.5
EXECUTORS = ["sequential", "vectorized"]


def global_loss(ws, x, y, flags):
    return F.cross_entropy(ws.model(x), y)


class ApflAsWorkspaceCopy(Method):
    """The mistake as a new user writes it: the local model as a workspace copy, trained by an
    Update, read back from client_state (where nothing ever puts it)."""

    name = "apfl_copy"
    copies = ("local",)

    def client_start(self, global_state, client_state, server) -> ClientStart:
        return ClientStart({"model": self.start_state(global_state, client_state),
                            "local": client_state.get("local", global_state)})

    def local_stages(self, rnd, server):
        def local_loss(ws, x, y, flags):
            with torch.no_grad():
                w_out = ws.model(x)
            return F.cross_entropy(ALPHA * ws.local(x) + (1 - ALPHA) * w_out, y)

        return [Stage((Update(("model.",), global_loss), Update(("local.",), local_loss, report=None)))]


class Apfl(Method):
    """The declared form: the local model is a private model, `model.local`."""

    name = "apfl"
    private_models = ("local",)

    def local_stages(self, rnd, server):
        def local_loss(ws, x, y, flags):
            with torch.no_grad():
                w_out = ws.model(x)
            return F.cross_entropy(ALPHA * ws.model.local(x) + (1 - ALPHA) * w_out, y)

        return [Stage((Update(("model.encoder.", "model.projector.", "model.head."), global_loss),
                       Update(("model.local.",), local_loss, report="local_loss")))]

    def predict(self, model, x, client_state, server):
        return ALPHA * model.local(x) + (1 - ALPHA) * model(x)


def sim_of(method: type[Method], executor: str) -> Simulation:
    exp = load_experiment(None, ["data.num_clients=3", "fl.participation=1", "fl.rounds=3", "model.arch=mlp",
                                 "data.partition.kind=pathological", "data.partition.classes_per_client=4",
                                 f"runtime.executor={executor}"])
    return Simulation(exp, method)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_trained_workspace_copy_that_nothing_keeps_is_a_one_line_error(executor):
    sim = sim_of(ApflAsWorkspaceCopy, executor)
    with pytest.raises(MethodDefinitionError) as info:
        sim.run_round()
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith("method apfl_copy: an Update trains workspace copy 'local' (trains 'local.')")
    assert "private_models = ('local',)" in line and "scratch_copies = ('local',)" in line
    assert sim.round == 0 and not sim.client_states.get(0)  # raised before any client trained


def test_a_scratch_copy_must_be_one_of_the_copies():
    class Misnamed(Method):
        name = "misnamed"
        copies = ("glob",)
        scratch_copies = ("siamese",)

    with pytest.raises(MethodDefinitionError, match=r"^method misnamed: scratch_copies 'siamese' is not in copies"):
        sim_of(Misnamed, "sequential").run_round()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_private_model_is_kept_across_rounds_and_is_not_the_global_model(executor):
    sim = sim_of(Apfl, executor)
    assert Apfl.personal_is_global is False  # declared by private_models
    assert not any(k.startswith("local.") for k in sim.shared)  # never uploaded
    key = "head.0.weight"
    start = sim.method.client_start(sim.global_state, {}, sim.server_state).models["model"]
    assert torch.equal(start["local." + key], start[key])  # v starts as the received global model

    sim.run_round()
    after_1 = {cid: sim.client_states[cid]["private"]["local." + key].clone() for cid in range(3)}
    # round 2 starts each client's v from its own trained copy, not from the new global model
    for cid in range(3):
        start = sim.method.client_start(sim.global_state, sim.client_states[cid], sim.server_state).models["model"]
        assert torch.equal(start["local." + key], after_1[cid])
        assert not torch.equal(start["local." + key], sim.global_state[key])

    sim.run_round()
    for cid in range(3):
        v = sim.client_states[cid]["private"]["local." + key]
        assert not torch.equal(v, sim.global_state[key])  # the personal model is not the global one
        assert not torch.equal(v, after_1[cid])  # trained on in round 2, from where round 1 left it
        # and it persists: round 3 starts from it, and evaluation predicts with it
        start = sim.method.client_start(sim.global_state, sim.client_states[cid], sim.server_state).models["model"]
        assert torch.equal(start["local." + key], v)
        sim.method.load_personal(sim.model, sim.global_state, sim.client_states[cid], sim.server_state)
        assert torch.equal(sim.model.local.head[0].weight, v)
    assert not torch.equal(after_1[0], after_1[1])  # each client keeps its own


def test_sharing_places_each_key_once_by_pattern():
    """`Sharing` on fixed keys: what a client uploads, downloads and keeps (issue 38: shared_keys and
    keep_private stated one policy twice, and could disagree)."""
    from autofl.methods.base import Sharing

    keys = ["encoder.0.weight", "encoder.1.running_mean", "projector.0.weight", "head.weight", "global_head.weight"]
    fedavg = Sharing()
    assert [k for k in keys if fedavg.is_uploaded(k)] == keys and not any(fedavg.is_kept(k) for k in keys)
    fedper = Sharing(local=("head.*",))
    assert [k for k in keys if not fedper.is_uploaded(k)] == ["head.weight"]
    assert [k for k in keys if fedper.is_kept(k)] == ["head.weight"]
    fedfcd = Sharing(local=("*",), server_trained=("global_head.*",))  # server-trained wins over local
    assert not any(fedfcd.is_uploaded(k) for k in keys)
    assert [k for k in keys if fedfcd.is_server_trained(k)] == ["global_head.weight"]
    assert [k for k in keys if fedfcd.is_kept(k)] == keys[:4]
    dualfed = Sharing(local=("projector.*", "head.*"), also_kept=("encoder.*.running_mean",))
    assert [k for k in keys if dualfed.is_uploaded(k)] == ["encoder.0.weight", "encoder.1.running_mean",
                                                           "global_head.weight"]
    assert [k for k in keys if dualfed.is_kept(k)] == ["encoder.1.running_mean", "projector.0.weight", "head.weight"]


@pytest.mark.parametrize("hook", ["shared_keys", "received_keys", "keep_private"])
def test_overriding_a_declared_policy_hook_is_a_one_line_error(hook):
    """The sharing policy is declared once (`sharing`); a method overriding the hook that used to state it
    is refused when its class is made, naming what to declare instead."""
    with pytest.raises(MethodDefinitionError, match=f"overrides {hook}: declare `sharing = Sharing"):
        type("Twice", (Method,), {"name": "twice", hook: lambda self, *args: []})
    mixin = type("KeysMixin", (), {hook: lambda self, *args: []})  # not a Method: its hook would still run
    with pytest.raises(MethodDefinitionError, match=f"overrides {hook} \\(through KeysMixin\\): declare"):
        type("Mixed", (mixin, Method), {"name": "mixed"})
    type("Shadowed", (Method, mixin), {"name": "shadowed"})  # Method's own comes first in the MRO: allowed


# per method on mlp (digits): the model parts a client uploads, downloads and keeps under
# client_state["private"], and what else it remembers; read from the code before `sharing` (86d787c)
SHARING_TABLE = {
    "ditto": (["encoder", "head"], ["encoder", "head"], ["personal"], []),
    "dualfed": (["encoder", "global_head"], ["encoder", "global_head"], ["head", "projector"], []),
    "fdcl": (["encoder", "head"], ["encoder", "head"], [], ["prev"]),
    "fedavg": (["encoder", "head"], ["encoder", "head"], [], []),
    "fedeccr": (["encoder", "head"], ["encoder", "head"], [], []),
    "fedfcd": ([], ["global_head"], ["encoder", "head"], []),
    "fedgh": ([], ["head"], ["encoder"], []),
    "fedper": (["encoder"], ["encoder"], ["head"], []),
    "fedproto": ([], [], ["encoder", "head"], []),
    "fedprox": (["encoder", "head"], ["encoder", "head"], [], []),
    "fedrep": (["encoder"], ["encoder"], ["head"], []),
    "fedsiam_da": (["encoder", "head", "predictor", "projector"], ["encoder", "head", "predictor", "projector"], [],
                   ["personal"]),
    "local": ([], [], ["encoder", "head"], []),
    "moon": (["encoder", "head"], ["encoder", "head"], [], ["prev"]),
}


def _placed(name: str, arch: str = "mlp", dataset: str = "digits"):
    from autofl.registry import METHODS

    cls = METHODS.get(name)
    exp = load_experiment(overrides=[f"method.name={name}", f"data.dataset={dataset}", f"model.arch={arch}"])
    shape = (1, 8, 8) if dataset == "digits" else (3, 32, 32)
    method = cls(exp.method.typed(cls.Params), exp, shape, 10)
    model = method.build_model()
    client: dict = {}
    method.keep_private(dict(model.state_dict()), client)
    return method.shared_keys(model), method.received_keys(model), client


@pytest.mark.parametrize("name", sorted(SHARING_TABLE))
def test_every_built_in_uploads_downloads_and_keeps_what_it_did_before_sharing_was_declared(name):
    """Each built-in's `sharing` places its weights where its overridden hooks did (issue 38)."""
    shared, received, client = _placed(name)
    parts = lambda keys: sorted({k.split(".")[0] for k in keys})  # noqa: E731
    assert (parts(shared), parts(received), parts(client.get("private", {})),
            sorted(k for k in client if k != "private")) == SHARING_TABLE[name]


def test_dualfeds_encoder_bn_statistics_are_uploaded_and_each_clients_own():
    """DualFed averages its encoder's BN statistics for the global model and keeps each client's own
    for its personal model (`also_kept`), on an arch that has them."""
    shared, _, client = _placed("dualfed", arch="resnet18", dataset="cifar10")
    stats = [k for k in shared if k.startswith("encoder.") and k.endswith(("running_mean", "running_var"))]
    assert stats and set(stats) <= set(client["private"])
    assert not any(k.startswith("encoder.") and k.endswith("weight") for k in client["private"])


@pytest.mark.parametrize("name", sorted(SHARING_TABLE))
def test_a_methods_layout_is_its_models_and_costs_no_draw_and_no_build_first(name):
    """`Method.layout` (what hooks read of the model: FedRep's and FedFCD's encoder, FedSiam-DA's parameter
    keys) is the built model's, read before any `build_model` call, and draws nothing from the seeded
    global stream (issue 38: it was instance state that `build_model` set for other hooks to read)."""
    from autofl.registry import METHODS

    cls = METHODS.get(name)
    exp = load_experiment(overrides=[f"method.name={name}", "data.dataset=digits", "model.arch=mlp"])
    method = cls(exp.method.typed(cls.Params), exp, (1, 8, 8), 10)
    torch.manual_seed(3)
    layout = method.layout
    after = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(1))
    assert layout.parameter_keys == tuple(key for key, _ in method.build_model().named_parameters())
    assert layout.trains("encoder.") and layout.trains("head.") and not layout.trains("nowhere.")


def test_a_head_that_takes_every_layer_leaves_no_encoder_stage_before_the_model_is_built():
    """With model.head_layers covering the whole mlp the encoder has no parameters: FedRep then trains
    the head alone, decided from the layout on a method that has built nothing. (FedFCD reads the same
    layout; its config refuses such a head, its feature loss being a constant then.)"""
    from autofl.engine.server import ServerState
    from autofl.registry import METHODS

    cls = METHODS.get("fedrep")
    exp = load_experiment(overrides=["method.name=fedrep", "data.dataset=digits", "model.arch=mlp", "model.head_layers=2"])
    method = cls(exp.method.typed(cls.Params), exp, (1, 8, 8), 10)
    assert not method.layout.trains("encoder.")
    stages = method.local_stages(0, ServerState())
    assert [[u.trains for u in stage.updates] for stage in stages] == [[("model.head.",)]]

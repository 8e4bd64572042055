"""The method interface: the few hooks through which the FL engine runs any method.

The engine knows no method by name. A method is one module that subclasses `Method`, declares
its parameters as a pydantic model, and overrides only the hooks it changes. The defaults are
FedAvg: everything shared, plain cross-entropy SGD, size-weighted averaging, personal = global.

A method never writes a training loop. It *declares* its local step (`local_stages`): a list of
stages, each a number of epochs over the client's batches, and per batch one or more `Update`s,
each naming the tensors it trains and its loss. The engine's reference executor
(`autofl.engine.sequential`) runs that declaration one client at a time; faster executors
(`autofl.accel`) run the same declaration and are held equal to it by tests. The loss is written
once, against modules, per client (batch means; a per-client flag such as `flags["has_prev"] * term`
rather than a Python branch on a tensor's value; no in-place writes to parameters):

    def loss(ws, x, y, flags):          # ws.model, plus the copies the method asked for (ws.glob ...)
        return F.cross_entropy(ws.model(x), y)

A proximal term is written `ws.proximal(params, anchor)` (sum ||w - anchor||^2), which declares it to
the executor. What the fast executors need beyond this is theirs to check (the engine page of the
docs says how they run a loss).

Where each weight lives is declared once, not written: `sharing` (a `Sharing`) says by key pattern what
a client uploads for the server to aggregate, what the server trains and sends, and what a client keeps
as its own from round to round (by default everything is uploaded, so nothing is kept);
`private_models` names models of the model's layout held inside the model (`model.<name>`, e.g. a
personal model), each client's own; `copies` names workspace copies filled by `client_start` each round
and dropped after it (an update may train one only if `scratch_copies` lists it: a trained copy
nothing keeps is an error). What else a client remembers between rounds (its previous local model)
is the `remember` hook's.

The server side is values in, values out (as Flower's Strategy and FedJAX's ServerState): a
method never sees the simulation. Its server-side state is one frozen dataclass, a subclass of
`ServerState` named in `Method.State`, whose fields all have defaults; the engine keeps it, saves
it whole in checkpoints, rebuilds it on restore, and hands it to the hooks that read it:

    init_server(ctx: ServerContext) -> ServerUpdate                   # once, before round 0
    aggregate(uploads: list[Upload]) -> StateDict                     # after each round's training
    server_update(ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate   # after aggregate

`ServerContext` (autofl.engine.server) holds the round, the number of rounds, whether the round is
evaluated, the global state (read-only), the method's current `state`, the federated data, a model
to borrow as scratch, the device, and `ctx.generator("name")`, a torch.Generator seeded for the
method's stream of draws of that name.
`ServerUpdate(global_state=..., state=...)` returns new global-state entries and/or the new server
state; nothing else the hook does is kept. The other hooks are:

    build_model() -> SplitModel                   server_payload(server) -> dict   (what a client downloads)
    client_start(global_state, client_state, server) -> ClientStart
    local_stages(rnd, server) -> list[Stage]      upload_payload(client: TrainedClient) -> dict
    remember(trained, client_state) -> None       (writes the client's own dict)
    load_personal(model, global_state, client_state, server) -> None
    predict(model, x, client_state, server) -> Tensor
    load_global(model, global_state, server) -> None
    predict_global(model, x, server) -> Tensor

where `server` is the method's current `ServerState` (the `State` subclass) and `client_state` the
client's own dict (what `sharing` kept, under "private", and what `remember` stored).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import torch
import torch.nn.functional as F
from pydantic import ValidationError

from autofl.config import MethodConfig, Strict
from autofl.engine.plan import ClientStart, LossFn, ModelCopies, Stage, TrainedClient, Update, Upload
from autofl.engine.server import ServerContext, ServerState, ServerUpdate
from autofl.engine.state import StateDict, weighted_average
from autofl.errors import MethodDefinitionError, format_validation_error
from autofl.models.parts import SplitModel, build_model
from autofl.registry import METHODS, MODELS

if TYPE_CHECKING:
    from autofl.config import Experiment

__all__ = [
    "ClientStart",
    "LossFn",
    "Method",
    "MethodParams",
    "ModelLayout",
    "ServerContext",
    "ServerState",
    "ServerUpdate",
    "Sharing",
    "Stage",
    "StateDict",
    "TrainedClient",
    "Update",
    "Upload",
]

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


class MethodParams(Strict):
    """A method's own hyperparameters; unknown keys and non-finite numbers are errors."""


@dataclass(frozen=True)
class Sharing:
    """Where each of the model's weights lives, as glob patterns over its state-dict keys ("head.*",
    "encoder.*.running_mean"). Every key a client neither keeps local nor gets from the server's own
    training is uploaded and aggregated into the global state (the default: all of them, FedAvg).

    - `local`: what stays on each client, never uploaded: its own from round to round, laid over the
      global state at its next start (FedPer's head; "*" where nothing is aggregated);
    - `server_trained`: what the server trains and every sampled client downloads, never uploaded
      nor kept (FedGH's head, FedFCD's global head); it wins over `local`;
    - `also_kept`: uploaded keys each client also keeps as its own (DualFed's encoder BN statistics:
      averaged for the global model, the client's own for its personal one).

    The keys of `Method.private_models` are each client's own in any case."""

    local: tuple[str, ...] = ()
    server_trained: tuple[str, ...] = ()
    also_kept: tuple[str, ...] = ()

    @staticmethod
    def _any(patterns: tuple[str, ...], key: str) -> bool:
        return any(fnmatchcase(key, pattern) for pattern in patterns)

    def is_server_trained(self, key: str) -> bool:
        return self._any(self.server_trained, key)

    def is_uploaded(self, key: str) -> bool:
        return not self._any(self.local, key) and not self.is_server_trained(key)

    def is_kept(self, key: str) -> bool:
        if self.is_server_trained(key):
            return False
        return self._any(self.local, key) or self._any(self.also_kept, key)


@dataclass(frozen=True)
class ModelLayout:
    """What a hook may read of the method's model without holding one: the state-dict keys of its
    trainable parameters (buffers such as BN statistics are not among them)."""

    parameter_keys: tuple[str, ...]

    def trains(self, prefix: str) -> bool:
        """Whether the model has a trainable parameter under `prefix` ("encoder.": none when the head
        takes every layer)."""
        return any(key.startswith(prefix) for key in self.parameter_keys)


# each method instance's layout (`Method.layout`), read once
_LAYOUTS: weakref.WeakKeyDictionary[Method, ModelLayout] = weakref.WeakKeyDictionary()

# hooks a method no longer overrides: what they decided is declared (`sharing`) or hooked (`remember`)
_DECLARED_NOT_OVERRIDDEN = {
    "shared_keys": "declare `sharing = Sharing(local=...)` instead",
    "received_keys": "declare `sharing = Sharing(server_trained=...)` instead",
    "keep_private": "declare `sharing = Sharing(local=..., also_kept=...)` for the weights a client keeps, and override "
    "`remember(trained, client_state)` for anything else it stores",
}


class Method:
    """Defaults implement FedAvg; subclasses override the hooks they change."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[MethodParams]] = MethodParams
    State: ClassVar[type[ServerState]] = ServerState  # the method's server state (a frozen dataclass)
    uses_projector: ClassVar[bool] = False  # whether model.projector_depth / projector_dim apply
    default_projector_depth: ClassVar[int] = 0
    min_projector_depth: ClassVar[int] = 0
    projector_out_dim: ClassVar[int | None] = None  # the projector's output width; None: the encoder's
    has_global_model: ClassVar[bool] = True  # whether global_* metrics are defined
    # whether the method's own loss terms act on the encoder's features (contrastive, prototype):
    # then the encoder must keep a trainable layer, or those terms are constants
    trains_encoder_features: ClassVar[bool] = False
    personal_is_global: ClassVar[bool] = True  # personal model = global model (False when private_models)
    # private models: copies of the model's layout held inside the model as `model.<name>` (a personal
    # model, e.g. Ditto's v), each client's own: never uploaded, a client starts each round from its own
    # trained copy (the received global model's weights before its first participation), and the
    # engine keeps it after training. Trained as `model.<name>.`, read in `predict` as `model.<name>`.
    private_models: ClassVar[tuple[str, ...]] = ()
    # where each weight lives: uploaded and aggregated, kept by the client, trained by the server
    sharing: ClassVar[Sharing] = Sharing()
    # workspace copies the local step reads (ws.glob, ws.prev ...), filled by `client_start` each round;
    # frozen unless an update trains them, and dropped after the round: an update may train one only
    # if it is also listed in `scratch_copies` (trained and dropped on purpose, as FedSiam-DA's f')
    copies: ClassVar[tuple[str, ...]] = ()
    scratch_copies: ClassVar[tuple[str, ...]] = ()
    # whether configs of this method may train as members of one population (autofl.population): its
    # local step reads each of its fusible parameters (`Params` fields declared with
    # `json_schema_extra=FUSIBLE`) through `self.fused(flags, name)`, and nothing else that differs
    # between configs (no server state, no other parameter). A method that does not say so still runs
    # in a population, each of its configs alone (populations of one).
    population_ready: ClassVar[bool] = False
    # whether its local step is the same program at every round: `local_stages` and the losses read the
    # round and the server state only through flags (`client_start`), never as Python values or branches.
    # Then members of a population that are at different rounds (a cohort refilled as ASHA prunes its
    # members) still train as one batched model; otherwise members train together only with those at
    # their own round.
    same_steps_every_round: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook, instead in _DECLARED_NOT_OVERRIDDEN.items():
            # the definition the class would run (its own, a base's or a mixin's): the policy stated twice could disagree
            owner = next(klass for klass in cls.__mro__ if hook in klass.__dict__)
            if owner is not Method:
                where = "" if owner is cls else f" (through {owner.__qualname__})"
                raise MethodDefinitionError(f"method {cls.__qualname__} overrides {hook}{where}: {instead}")
        if cls.private_models:  # a client's own model: its personal predictions are not the global model's
            cls.personal_is_global = False

    def __init__(self, params: MethodParams, exp: Experiment, input_shape: tuple[int, ...], num_classes: int):
        self.params = params
        self.exp = exp
        self.input_shape = input_shape
        self.num_classes = num_classes
        self._spares: dict[str, torch.nn.Module] = {}

    # ----- config ----------------------------------------------------------------------------
    @classmethod
    def resolve_experiment(cls, exp: Experiment, all_methods: dict[str, type[Method]]) -> Experiment:
        """Validate the method's parameters and projector settings; fill the method's defaults.
        Raises ValueError with one line naming the key and what is allowed."""
        try:
            params = cls.Params(**exp.method.params())
        except ValidationError as err:
            raise ValueError(
                format_validation_error(err, cls.Params, prefix="method.", context=f" for method {cls.name}")
            ) from None
        exp.method = MethodConfig(name=cls.name, **params.model_dump()).carry(params)
        model = exp.model

        arch = MODELS.get(model.arch)
        if cls.trains_encoder_features and arch.linear_only and model.head_layers >= arch.linear_layers:
            raise ValueError(
                f"model.head_layers: {model.head_layers} leaves arch {model.arch} no trainable encoder, "
                f"so method {cls.name}'s feature loss would be a constant; allowed: "
                f"1..{arch.linear_layers - 1}"
            )
        if not cls.uses_projector:
            for key in ("projector_depth", "projector_dim"):
                if getattr(model, key) is not None:
                    users = ", ".join(n for n, c in sorted(all_methods.items()) if c.uses_projector)
                    raise ValueError(f"model.{key}: not used by method {cls.name}; methods with a projector: {users}")
            return exp
        if model.projector_depth is None:
            model.projector_depth = cls.default_projector_depth
        if model.projector_dim is None:
            model.projector_dim = 256
        if model.projector_depth < cls.min_projector_depth:
            raise ValueError(
                f"model.projector_depth: method {cls.name} needs a projector; allowed {cls.min_projector_depth}..8"
            )
        return exp

    # ----- model -----------------------------------------------------------------------------
    def build_model(self) -> SplitModel:
        """The model of the configured arch, with a copy of it for each of `private_models` (each
        starts where the model starts)."""
        model = build_model(self.exp.model, self.input_shape, self.num_classes, self.projector_out_dim)
        if self.private_models:
            template = copy.deepcopy(model)
            for name in self.private_models:
                model.add_module(name, copy.deepcopy(template))
        return model

    @property
    def layout(self) -> ModelLayout:
        """The layout of `build_model()`'s model, for hooks that depend on it (which parts have
        parameters, which keys are parameters): built once on the meta device, so it allocates no
        weights and draws nothing from the seeded random streams, whenever a hook first asks. Kept
        beside the method, not in its attributes: a fast executor keys a loss's graphs on the attributes
        of the method it is bound to, and one that appeared mid-run would make them capture anew."""
        layout = _LAYOUTS.get(self)
        if layout is None:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                model = self.build_model()
            layout = _LAYOUTS[self] = ModelLayout(tuple(name for name, _ in model.named_parameters()))
        return layout

    def private_prefixes(self) -> tuple[str, ...]:
        """State-dict key prefixes of the private models (`personal.` for Ditto's v)."""
        return tuple(f"{name}." for name in self.private_models)

    def spare(self, name: str, like: ModuleT) -> ModuleT:
        """A second model instance of the same layout, built once and reused by loading states."""
        if name not in self._spares:
            self._spares[name] = copy.deepcopy(like)
        return cast(ModuleT, self._spares[name])  # a copy of the first `like` asked for under `name`

    def shared_keys(self, model: SplitModel) -> list[str]:
        """State-dict keys a client uploads and the server aggregates (all but `sharing`'s local and
        server-trained keys, and a private model's). Declared, not overridden."""
        private = self.private_prefixes()
        return [
            k for k in model.state_dict() if self.sharing.is_uploaded(k) and not (private and k.startswith(private))
        ]

    def received_keys(self, model: SplitModel) -> list[str]:
        """State-dict keys of the global state a sampled client downloads at the start of a round
        (counted in `download_bytes`): the shared keys and the server-trained ones."""
        shared = set(self.shared_keys(model))
        return [k for k in model.state_dict() if k in shared or self.sharing.is_server_trained(k)]

    def server_payload(self, server: ServerState) -> dict[str, Any]:
        """What the server sends each sampled client besides the global state's `received_keys`
        (global prototypes ...), read from the server state the round starts with; counted in
        `download_bytes`. Default: nothing."""
        return {}

    # ----- server ----------------------------------------------------------------------------
    def init_server(self, ctx: ServerContext) -> ServerUpdate:
        """Called once before round 0, `ctx.state` being `State()` (e.g. initial prototypes)."""
        return ServerUpdate()

    def aggregate(self, uploads: list[Upload]) -> StateDict:
        return weighted_average([u.state for u in uploads], [u.num_samples for u in uploads])

    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate:
        """Called after each round's aggregation, `ctx.global_state` already holding the aggregate."""
        return ServerUpdate()

    # ----- client ----------------------------------------------------------------------------
    def start_state(self, global_state: StateDict, client_state: dict[str, Any]) -> StateDict:
        """The client's starting weights: the global model, overlaid with its private parameters; a
        private model the client has not trained yet starts as the received global model."""
        own = client_state.get("private", {})
        fresh: StateDict = {}
        private = self.private_prefixes()
        for prefix in private:
            if not any(k.startswith(prefix) for k in own):
                fresh.update({prefix + k: v for k, v in global_state.items() if not k.startswith(private)})
        return {**global_state, **fresh, **own}

    def client_start(self, global_state: StateDict, client_state: dict[str, Any], server: ServerState) -> ClientStart:
        """The trained model's start plus any copies in `copies` (override to fill them)."""
        return ClientStart({"model": self.start_state(global_state, client_state)})

    def start_with_previous(self, global_state: StateDict, client_state: dict[str, Any]) -> ClientStart:
        """For methods that contrast with the received global model (`ws.glob`) and the client's
        previous local model (`ws.prev`, stored by `remember` as client_state["prev"]): before a
        client's first participation there is none, and `flags["has_prev"]` is 0 (the term is off)."""
        prev = client_state.get("prev")
        return ClientStart(
            {
                "model": self.start_state(global_state, client_state),
                "glob": global_state,
                "prev": prev if prev is not None else global_state,
            },
            {"has_prev": float(prev is not None)},
        )

    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]:
        """The local step of round `rnd` (0-based); default: all of the model on `loss`."""
        return [Stage((Update(("model.",), self.loss),))]

    def loss(self, ws: ModelCopies, x: torch.Tensor, y: torch.Tensor, flags: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(ws.model(x), y)

    def fused(self, flags: dict[str, torch.Tensor], name: str) -> torch.Tensor | float:
        """The fusible parameter `name` as a loss reads it: the per-client tensor a population executor
        supplies under `flags["method.<name>"]` (each member's own value), else `self.params.<name>`."""
        value = flags.get(f"method.{name}")
        return value if value is not None else float(getattr(self.params, name))

    def upload_payload(self, client: TrainedClient) -> dict[str, Any]:
        """Extra uploads computed from the trained model (prototypes, statistics)."""
        return {}

    def keep_private(self, trained: StateDict, client_state: dict[str, Any]) -> None:
        """After local training (the engine calls it; `trained` is the client's own copy): keep what
        `sharing` and `private_models` say stays on the client, then what `remember` stores."""
        private = self.private_prefixes()
        own = {k: v for k, v in trained.items() if self.sharing.is_kept(k) or (private and k.startswith(private))}
        if own:
            client_state["private"] = own
        self.remember(trained, client_state)

    def remember(self, trained: StateDict, client_state: dict[str, Any]) -> None:
        """Store anything else a client needs at its next participation in its own dict (MOON's
        previous local model, `client_state["prev"]`). Default: nothing."""

    # ----- evaluation ------------------------------------------------------------------------
    def load_personal(
        self, model: SplitModel, global_state: StateDict, client_state: dict[str, Any], server: ServerState
    ) -> None:
        model.load_state_dict(self.start_state(global_state, client_state))

    def predict(
        self, model: SplitModel, x: torch.Tensor, client_state: dict[str, Any], server: ServerState
    ) -> torch.Tensor:
        """Logits of a client's personal model (already loaded into `model`)."""
        return model(x)

    def load_newcomer(
        self, model: SplitModel, trained: StateDict, client_state: dict[str, Any], server: ServerState
    ) -> None:
        """A held-out client's personal model (data.holdout_clients; `predict` then reads it with
        `client_state`): `trained` is what its newcomer training left, the received global model
        after eval.newcomer_epochs of this method's local step on its own data (the model as received
        with 0 epochs); `client_state` what `sharing` and `remember` kept of it. Default: `trained`, the global
        model fine-tuned on the client's own data. Override for a method that personalizes a newcomer
        another way."""
        model.load_state_dict(trained)

    def load_global(self, model: SplitModel, global_state: StateDict, server: ServerState) -> None:
        model.load_state_dict(global_state)

    def predict_global(self, model: SplitModel, x: torch.Tensor, server: ServerState) -> torch.Tensor:
        return model(x)


METHODS.accept(Method)  # plugin entries in autofl.methods must subclass Method

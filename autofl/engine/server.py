"""The values between the engine and a method's server side: what a server hook receives
(`ServerContext`) and what it returns (`ServerUpdate`), and the method's server state
(`ServerState`), one frozen dataclass that checkpoints save and restore whole.

A server hook never sees the simulation: it reads a `ServerContext` and returns a
`ServerUpdate`; the engine applies it (new entries of the global state, the method's new server
state). The engine hands the current server state to the client and evaluation hooks that read it
(`local_stages`, `client_start`, `load_personal`, `predict`, `load_global`, `predict_global`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from autofl.data.federated import FederatedData
from autofl.engine.plan import ClientStart, Stage, TrainedClient, Upload
from autofl.engine.state import StateDict
from autofl.models.parts import SplitModel
from autofl.seeding import derived_seed, named_stream


@dataclass(frozen=True)
class ServerState:
    """A method's server-side state (prototypes, a calibrated head ...). A method subclasses it
    (a frozen dataclass whose fields all have defaults: the state before `init_server`) and names
    it in `Method.State`. Fields hold tensors, numbers and containers of them (and
    `autofl.features.ClassStats`): a checkpoint stores the fields and rebuilds the class from them."""

    def field_values(self) -> dict[str, Any]:
        """The fields by name, values as they are (what a checkpoint stores)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class ServerContext:
    """What a server hook may read. Values only: changing them changes nothing in the simulation.

    `round` is the round the hook belongs to, 0-based: in `init_server` the first round (0, before
    any training), in `server_update` the round just trained; `completed` counts the rounds done
    after the hook (0 in `init_server`, round + 1 in `server_update`); `evaluated` says whether
    metrics are computed after this hook (then the evaluation hooks see the returned state).
    `global_state` is the aggregated global state (read-only view), `state` the method's server
    state before the hook. `model` is a model of the method's layout to borrow as scratch (load
    any state into it; the engine reloads it before it uses it again); `data` the whole federated
    data set on `device`."""

    round: int
    completed: int
    rounds: int
    evaluated: bool
    seed: int
    global_state: Mapping[str, torch.Tensor]
    state: ServerState
    data: FederatedData
    model: SplitModel
    device: torch.device

    def generator(self, stream: str | int, rnd: int | None = None) -> torch.Generator:
        """A CPU `torch.Generator` seeded from (seed, `rnd` (default: `round`), `stream`): the same draws
        on every run and after a restore. `stream` names the method's stream of draws, a string
        (`"global_head"`; `autofl.seeding.named_stream`), or a number a built-in kept so that its runs
        reproduce (distinct from `SeedPurpose`'s values)."""
        parts = named_stream(stream) if isinstance(stream, str) else (int(stream),)
        return torch.Generator().manual_seed(derived_seed(self.seed, self.round if rnd is None else rnd, *parts))


@dataclass(frozen=True)
class ServerUpdate:
    """What a server hook returns: `global_state` entries replace those of the global state (the
    other keys stay), and `state`, when given, becomes the method's server state.

    `upload_bytes` / `download_bytes`: client traffic the hook's work stands for, counted into the
    run's cost (autofl.engine.cost): the simulation lets a hook compute from every client's data on
    the server (FedFCD's first LFRs, FedECCR's calibration statistics) what a deployment has the
    clients compute and send."""

    global_state: Mapping[str, torch.Tensor] = field(default_factory=dict)
    state: ServerState | None = None
    upload_bytes: int = 0
    download_bytes: int = 0


class MethodHooks(Protocol):
    """What the engine calls on a method (autofl.methods.base.Method implements it; the engine
    receives the class from the composition root and never imports the methods)."""

    name: ClassVar[str]
    State: ClassVar[type[ServerState]]
    copies: ClassVar[tuple[str, ...]]
    scratch_copies: ClassVar[tuple[str, ...]]
    has_global_model: ClassVar[bool]
    personal_is_global: ClassVar[bool]

    def build_model(self) -> SplitModel: ...
    def shared_keys(self, model: SplitModel) -> list[str]: ...
    def received_keys(self, model: SplitModel) -> list[str]: ...
    def server_payload(self, server: ServerState) -> dict[str, Any]: ...
    def init_server(self, ctx: ServerContext) -> ServerUpdate: ...
    def aggregate(self, uploads: list[Upload]) -> StateDict: ...
    def server_update(self, ctx: ServerContext, uploads: list[Upload]) -> ServerUpdate: ...
    def client_start(
        self, global_state: StateDict, client_state: dict[str, Any], server: ServerState
    ) -> ClientStart: ...
    def local_stages(self, rnd: int, server: ServerState) -> list[Stage]: ...
    def upload_payload(self, client: TrainedClient) -> dict[str, Any]: ...
    def keep_private(self, trained: StateDict, client_state: dict[str, Any]) -> None: ...
    def load_personal(
        self, model: SplitModel, global_state: StateDict, client_state: dict[str, Any], server: ServerState
    ) -> None: ...
    def predict(
        self, model: SplitModel, x: torch.Tensor, client_state: dict[str, Any], server: ServerState
    ) -> torch.Tensor: ...
    def load_newcomer(
        self, model: SplitModel, trained: StateDict, client_state: dict[str, Any], server: ServerState
    ) -> None: ...
    def load_global(self, model: SplitModel, global_state: StateDict, server: ServerState) -> None: ...
    def predict_global(self, model: SplitModel, x: torch.Tensor, server: ServerState) -> torch.Tensor: ...


class MethodClass(Protocol):
    """A method class as the composition root passes it to the engine: its `Params` model, its
    `copies`, and a constructor (params, experiment, input shape, number of classes)."""

    Params: Any
    copies: tuple[str, ...]

    def __call__(self, params: Any, exp: Any, input_shape: tuple[int, ...], num_classes: int) -> MethodHooks: ...

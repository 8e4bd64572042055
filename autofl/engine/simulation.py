"""The FL simulation: rounds, client sampling, local training, aggregation, evaluation.

All randomness is derived from (seed, round, client), so a run restored from a checkpoint at
round r continues exactly as the uninterrupted run would have.

The simulation runs any method through its hooks (`autofl.engine.server.MethodHooks`): the
composition root (autofl.api.train, the search's trainable, the scripts) resolves the method class
from the registry and passes it in; the engine imports no method.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from autofl.accel.choice import make_executor
from autofl.config import Experiment
from autofl.data.datasets import RawDataset, load_raw_dataset
from autofl.data.federated import FederatedData, build_federated
from autofl.device import resolve_device
from autofl.engine.cost import RunCost, round_samples, rounds_to_target, tensor_bytes, train_flops_per_sample
from autofl.engine.executor import ClientJob, ClientOutcome, RoundPlan, Workspace, batch_cuts
from autofl.engine.harm import HarmReference
from autofl.engine.metrics import ClientCounts, evaluate_with_counts
from autofl.engine.newcomers import personalize_newcomers
from autofl.engine.plan import TrainedClient, Upload, check_trained_copies
from autofl.engine.server import MethodClass, MethodHooks, ServerContext, ServerState, ServerUpdate
from autofl.engine.smoothing import smoothed_metrics
from autofl.engine.state import StateDict, clone_state, map_tree
from autofl.seeding import SeedPurpose, derived_seed


class Simulation:
    def __init__(
        self,
        exp: Experiment,
        method_cls: MethodClass,
        raw: RawDataset | None = None,
        device: torch.device | None = None,
        sealed_test: bool = False,
        data: FederatedData | None = None,
    ):
        """`data`: the federated data set built for an equal `exp.data` and seed, on this device and dtype
        and sealed as `sealed_test` says (a population's members share one); else built here from `raw`."""
        self.exp = exp
        self.device = device or resolve_device(exp.runtime.device)
        if exp.runtime.threads:
            torch.set_num_threads(exp.runtime.threads)
        self.dtype = getattr(torch, exp.runtime.dtype)
        if data is None:
            raw = raw if raw is not None else load_raw_dataset(exp.data)
            built = build_federated(raw, exp.data, exp.data_seed())
            # sealed_test (a search trial): every test split empty, so no round reads a test sample
            data = (built.without_test() if sealed_test else built).to(self.device, self.dtype)
        self.data: FederatedData = data
        self.method: MethodHooks = method_cls(
            exp.method.typed(method_cls.Params), exp, self.data.input_shape, self.data.num_classes
        )
        torch.manual_seed(exp.seed)
        self.model = self.method.build_model().to(self.device, self.dtype)
        self.shared = self.method.shared_keys(self.model)
        self.received = self.method.received_keys(self.model)  # what a sampled client downloads
        self.flops_per_sample = train_flops_per_sample(self.model, self.data.input_shape, self.data.num_classes)
        # bytes and FLOPs so far (autofl.engine.cost); FLOPs None where the model's cannot be counted
        self.cost = RunCost(train_flops=None if self.flops_per_sample is None else 0)
        self.global_state: StateDict = clone_state(self.model)
        self.workspace = Workspace(self.model, self.method.copies)
        self.executor, self.executor_line = make_executor(
            exp.runtime.executor,
            self.workspace,
            exp.runtime.client_chunk,
            self.device,
            exp.runtime.compile,
            exp.fl.rounds,
            self.lockstep_steps_per_round(),
        )
        self.client_states: dict[int, dict[str, Any]] = {}
        self.round = 0  # rounds completed
        self.history: list[dict[str, float]] = []
        # each client's correct predictions and split sizes behind the latest evaluated round's metrics
        self.client_counts: ClientCounts | None = None
        self.server_state: ServerState = self.method.State()  # the method's server-side state
        # a progress display's hook: told how many more of this round's clients finished training
        self.clients_done: Callable[[int], None] | None = None
        # eval.harmed_clients: the per-client references harmed_frac compares with (autofl.harm_references)
        self.harm_reference: HarmReference | None = None
        self._set_round_seed()
        self.apply(self.method.init_server(self.server_context(trained=False)))

    def lockstep_steps_per_round(self) -> int:
        """The vectorized executor's steps in a round: the longest client's batches times fl.local_epochs
        (a method's stages with epochs of their own, e.g. FedRep's head epochs, are counted as one)."""
        longest = max((len(c.train) for c in self.data.clients), default=0)
        return len(batch_cuts(longest, self.exp.fl.batch_size)) * self.exp.fl.local_epochs

    @property
    def num_clients(self) -> int:
        return len(self.data.clients)

    def _set_round_seed(self) -> None:
        torch.manual_seed(derived_seed(self.exp.seed, self.round, SeedPurpose.ROUND_TORCH))

    def sample_clients(self, rnd: int) -> list[int]:
        rng = np.random.default_rng([self.exp.seed, rnd, int(SeedPurpose.CLIENT_SAMPLING)])
        return sorted(int(c) for c in rng.choice(self.num_clients, size=self.exp.clients_per_round(), replace=False))

    def round_plan(self) -> RoundPlan:
        fl = self.exp.fl
        stages = self.method.local_stages(self.round, self.server_state)
        check_trained_copies(self.method.name, stages, self.method.copies, self.method.scratch_copies)
        return RoundPlan(
            stages,
            lr=fl.lr * fl.lr_decay**self.round,
            momentum=fl.momentum,
            weight_decay=fl.weight_decay,
            batch_size=fl.batch_size,
            local_epochs=fl.local_epochs,
            clients_done=self.clients_done,
        )

    def client_job(self, cid: int) -> ClientJob:
        state = self.client_states.setdefault(cid, {})
        return ClientJob(
            cid,
            self.method.client_start(self.global_state, state, self.server_state),
            self.data.clients[cid].train,
            torch.Generator().manual_seed(derived_seed(self.exp.seed, self.round, cid, SeedPurpose.CLIENT_BATCHES)),
        )

    def server_context(self, trained: bool) -> ServerContext:
        """What the method's server hooks read about round `self.round`: before it is trained
        (`init_server`) or after (`server_update`)."""
        completed = self.round + 1 if trained else self.round
        return ServerContext(
            round=self.round,
            completed=completed,
            rounds=self.exp.fl.rounds,
            evaluated=trained and self.will_evaluate(completed),
            seed=self.exp.seed,
            global_state=MappingProxyType(self.global_state),
            state=self.server_state,
            data=self.data,
            model=self.model,
            device=self.device,
        )

    def apply(self, update: ServerUpdate) -> None:
        """Take a server hook's result: new global-state entries, the method's new server state."""
        self.global_state.update(update.global_state)
        self.cost.upload_bytes += update.upload_bytes
        self.cost.download_bytes += update.download_bytes
        if update.state is not None:
            self.server_state = update.state

    def run_round(self) -> dict[str, float] | None:
        """Train one round; return its metrics when the round is evaluated, else None."""
        jobs, plan = self.begin_round()
        return self.finish_round(jobs, self.executor.train(plan, jobs, self.data.x, self.data.y))

    def begin_round(self) -> tuple[list[ClientJob], RoundPlan]:
        """A round up to its local training: the sampled clients' jobs and the round's plan (a
        population trains several simulations' jobs together, then finishes each: `finish_round`)."""
        self._set_round_seed()
        jobs = [self.client_job(cid) for cid in self.sample_clients(self.round)]
        plan = self.round_plan()
        # every sampled client receives the same: the global state's received keys and the server's payload
        received = {k: self.global_state[k] for k in self.received}
        self.cost.download_bytes += len(jobs) * (
            tensor_bytes(received) + tensor_bytes(self.method.server_payload(self.server_state))
        )
        sizes = [len(job.train_idx) for job in jobs]
        if self.flops_per_sample is not None and self.cost.train_flops is not None:
            self.cost.train_flops += self.flops_per_sample * round_samples(
                plan.stages, sizes, self.exp.fl.local_epochs, self.exp.fl.batch_size
            )
        return jobs, plan

    def finish_round(self, jobs: list[ClientJob], outcomes: list[ClientOutcome]) -> dict[str, float] | None:
        """A round after its local training (`outcomes` in the order of `jobs`): uploads, aggregation,
        the server update and, when the round is evaluated, its metrics (else None)."""
        uploads: list[Upload] = []
        for job, outcome in zip(jobs, outcomes):
            self.model.load_state_dict(outcome.state)
            trained = TrainedClient(
                job.cid, self.round, self.model, self.data.x, self.data.y, job.train_idx, self.data.num_classes
            )
            sent = self.method.upload_payload(trained)
            payload = {**sent, **{k: v for k, v in outcome.losses.items() if k != "loss"}}
            upload = Upload(
                job.cid, len(job.train_idx), {k: outcome.state[k] for k in self.shared}, payload, outcome.losses["loss"]
            )
            self.cost.upload_bytes += tensor_bytes(upload.state) + tensor_bytes(sent)  # the losses are reports
            uploads.append(upload)
            self.method.keep_private(outcome.state, self.client_states[job.cid])
        self.global_state.update(self.method.aggregate(uploads))
        self.apply(self.method.server_update(self.server_context(trained=True), uploads))
        self.round += 1
        train_loss = sum(u.loss * u.num_samples for u in uploads) / max(sum(u.num_samples for u in uploads), 1)
        if not self.will_evaluate(self.round):
            return None
        evaluated, self.client_counts = evaluate_with_counts(
            self, personalize_newcomers(self), self.harm_reference, self.exp.eval.global_metrics
        )
        metrics: dict[str, float] = {
            "round": self.round,
            **evaluated,
            "train_loss": train_loss,
            **self.cost.metrics(self.round),
        }
        so_far = [*self.history, metrics]
        metrics.update(smoothed_metrics(so_far))
        target = self.exp.eval.target_acc
        if target is not None:
            reached = rounds_to_target(so_far, self.exp.eval.target_metric, target)
            if reached is not None:  # left out until reached (as a split's keys without samples)
                metrics["rounds_to_target"] = reached
        self.history.append(metrics)
        return metrics

    def will_evaluate(self, completed_round: int) -> bool:
        """Whether metrics are computed after `completed_round` rounds (every eval_every, and the last)."""
        return completed_round % self.exp.fl.eval_every == 0 or completed_round == self.exp.fl.rounds

    def done(self) -> bool:
        return self.round >= self.exp.fl.rounds

    def run(self):
        """Yield the metrics of each evaluated round until `fl.rounds` are done."""
        while not self.done():
            metrics = self.run_round()
            if metrics is not None:
                yield metrics

    # ----- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "global_state": self.global_state,
            "client_states": self.client_states,
            "method_state": self.server_state.field_values(),
            "history": self.history,
            "cost": self.cost.state(),
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def to_device(obj: Any) -> Any:
            return map_tree(obj, lambda x: x.to(self.device) if isinstance(x, torch.Tensor) else x)

        self.round = int(state["round"])
        self.global_state = to_device(state["global_state"])
        self.client_states = to_device(state["client_states"])
        self.server_state = self.method.State(**to_device(state["method_state"]))
        self.history = list(state["history"])
        saved = state.get("cost", {})  # a checkpoint from before the cost metrics: counted from here
        self.cost = RunCost(
            int(saved.get("upload_bytes", 0)),
            int(saved.get("download_bytes", 0)),
            None if self.flops_per_sample is None else int(saved.get("train_flops") or 0),
        )
        torch.set_rng_state(state["torch_rng"])

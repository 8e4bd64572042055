"""The study's Tune searcher, on Tune's public `Searcher` interface: Optuna proposes through the
ledger's ask (any Optuna sampler: TPE, random, CMA-ES, ...), and every trial event goes to the
ledger, which alone decides the trial's state (autofl/tuning/store/ledger.py).

Per-round values are recorded by FL round (not training iteration), a trial stopped before
`max_t` rounds is PRUNED, and each trial carries its Tune trial id and run. The searcher's own
state (Tune id -> Optuna number, the trials it finished) is saved as JSON in Tune's experiment
folder; everything else lives in the Optuna storage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from autofl.files import write_atomic
from autofl.tuning.store import write_failure
from autofl.tuning.store.ledger import Ledger
from autofl.tuning.store.study import resolved_config
from autofl.tuning.strategy.objectives import direction


@contextmanager
def noting_failed_writes() -> Iterator[None]:
    """Tune logs what a searcher raises and goes on: a failed write (disk full, read-only) is noted
    first, so that the driver ends with it in one line (autofl/tuning/store/write_failure.py)."""
    try:
        yield
    except Exception as err:
        write_failure.note(err)
        raise


class StudySearcher(Searcher):
    CKPT_FILE_TMPL = "searcher-state-{}.json"

    def __init__(
        self,
        ledger: Ledger,
        define: Callable[[Any], dict[str, Any] | None],
        sampler: Any,
        metric: str | list[str],
        mode: str | list[str],
        max_t: int,
        run_name: str,
        budget: int,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        skip_repeats: bool = False,
    ):
        # Ray's Searcher keeps lists (several objectives) as they are; its annotation says str
        super().__init__(metric=metric, mode=mode)  # type: ignore[arg-type]
        self._skip_repeats = skip_repeats  # sampler.skip_repeats: autofl/tuning/strategy/repeats.py
        self._ledger = ledger
        self._define = define  # Optuna define-by-run: suggests the trial's params
        self._sampler = sampler
        self._metrics = list(metric) if isinstance(metric, list) else [metric]
        self._max_t = max_t
        self._run_name = run_name
        self._budget = budget
        self._trials: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self._finished: set[str] = set()  # Tune trial ids this searcher saw finish
        self._max_concurrent = 0  # no limit until Tune sets one

        modes = list(mode) if isinstance(mode, list) else [mode]
        ledger.study(sampler=sampler, create_directions=[direction(m) for m in modes])
        if points_to_evaluate:
            ledger.enqueue(points_to_evaluate)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune's `max_concurrent_trials`, applied here: Tune's ConcurrencyLimiter would forget its
        live trials on restore and then drop the resumed trials' results."""
        self._max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str) -> dict | str | None:  # type: ignore[override]  # Searcher.FINISHED is a str
        with noting_failed_writes():
            return self._suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        with noting_failed_writes():
            self._on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with noting_failed_writes():
            self._on_trial_complete(trial_id, result, error)

    def _suggest(self, trial_id: str) -> dict | str | None:
        live = len(set(self._trials) - self._finished)
        if self._max_concurrent and live >= self._max_concurrent:
            return None  # asked again when a trial completes
        skip_repeats = getattr(self, "_skip_repeats", False)  # a searcher pickled before the option: off
        asked = self._ledger.ask(
            self._run_name,
            trial_id,
            set(self._trials),
            self._budget,
            self._sampler,
            self._define,
            skip_repeats=skip_repeats,
        )
        if asked is None:
            return Searcher.FINISHED
        number, params = asked
        self._trials[trial_id] = number
        space = getattr(self._define, "space", None)
        if space is not None:  # `best-config export` reads it back without torch or the registries
            self._ledger.record_config(number, resolved_config(space, params))
        return params

    def _on_trial_result(self, trial_id: str, result: dict) -> None:
        if len(self._metrics) > 1:  # Optuna records no per-round values in multi-objective studies
            return
        value = result.get(self._metrics[0])
        if trial_id in self._finished or trial_id not in self._trials or value is None or not math.isfinite(value):
            return
        if not self._ledger.report(self._trials[trial_id], value, int(result["round"])):
            self._finished.add(trial_id)  # finished before an interrupted driver could save its state

    def _on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._finished or trial_id not in self._trials:
            return
        self._finished.add(trial_id)
        self._ledger.close(self._trials[trial_id], result, error, self._metrics, self._max_t)

    # ---- Tune's experiment snapshot: JSON, the rest is in the Optuna storage -------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "trials": self._trials,
            "finished": sorted(self._finished),
            "run": self._run_name,
            "budget": self._budget,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._trials = {str(k): int(v) for k, v in state["trials"].items()}
        self._finished = set(state["finished"])
        self._run_name, self._budget = state["run"], int(state["budget"])

    def save(self, checkpoint_path: str) -> None:
        # never through a link planted in the experiment folder
        write_atomic(Path(checkpoint_path), json.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as f:
            self.set_state(json.load(f))
        # trials this run's dead driver created after Tune's last snapshot: Tune does not know
        # them; released, so that this run's next asks adopt and train them. The sampler needs no
        # reseeding: each trial's seed comes from the study (autofl/tuning/strategy/trial_sampler.py)
        self._ledger.release_unknown_orphans(self._run_name, set(self._trials))

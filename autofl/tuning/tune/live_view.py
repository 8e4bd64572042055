"""The live view of `autofl search`: a Tune callback that shows the study as it runs.

In a terminal it is one rich table redrawn in place (trial, state, round reached / max, objective,
best so far, params) under a progress line (finished / requested trials, running, elapsed, ETA,
best). Elsewhere (CI, a pipe) it prints one line per trial event instead of redrawing.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ray.tune import Callback
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autofl.tuning.store.ledger import FINISHED_STATES, Ledger, counted, outcome
from autofl.tuning.strategy.cohorts import member_results
from autofl.tuning.strategy.constraints import is_feasible
from autofl.tuning.strategy.objectives import better
from autofl.views import format_params

MAX_ROWS = 15  # running trials first, then the most recently finished
_OPEN: set[LiveView] = set()


def close_all() -> None:
    """Stop any live display (after Tune returns or raises, e.g. on Ctrl-C)."""
    for view in list(_OPEN):
        view.close()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


class LiveView(Callback):
    def __init__(self, ledger: Ledger, console: Console | None = None):
        self._ledger = ledger
        self._start(console)

    def _start(self, console: Console | None) -> None:
        study = self._ledger.folder()
        space = study.space()
        self.objective, self.mode, self.max_rounds = space.objective, space.mode, space.max_rounds
        self.requested = self._ledger.record()["trials_requested"] or space.trials
        # in a pipe or CI log rich would wrap at 80 columns: give the event lines room instead
        self.console = console or Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False)
        self._study = study
        self.rows: dict[str, dict[str, Any]] = {}
        self._joined: dict[str, list[str]] = {}  # a refilled cohort's Tune trial id -> the members that joined it
        self.best: tuple[float, int | str] | None = None
        self.finished_before = 0
        self.finished_now = 0
        self.began = time.time()
        self._live: Live | None = None
        self._last_draw = 0.0

    # Tune pickles its callbacks with the experiment; a restored view starts afresh on this terminal
    def __getstate__(self) -> dict:
        return {"ledger": self._ledger}

    def __setstate__(self, state: dict) -> None:
        self._ledger = state["ledger"]
        self._start(None)

    # ---- Tune hooks --------------------------------------------------------------------------
    def setup(
        self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None, **info: Any
    ) -> None:  # Tune's Callback.setup signature
        self.began = time.time()
        for t in self._ledger.trials():
            if t.state.is_finished() and counted(t):
                self.finished_before += 1
            if t.state.name == "COMPLETE" and t.values and is_feasible(t):  # a warm-started one too
                self._offer(t.values[0], t.number)
        if self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            self._live.start()
            _OPEN.add(self)
        else:
            self.console.print(
                f"{self.finished_before} of {self.requested} trials already finished; running the rest", soft_wrap=True
            )

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        members = (trial.config or {}).get("members")
        if not isinstance(members, list):  # a trial of its own
            self._start_row(trial.trial_id, trial.config, "")
            return
        for m in members:  # a population trial: a row per member, each its own Optuna trial
            self._start_row(str(m["id"]), m["params"], f" (population of {len(members)})")

    def _start_row(self, key: str, params: dict[str, Any], note: str) -> None:
        number = self._number(key)
        self.rows[key] = {
            "trial": number,
            "state": "RUNNING",
            "round": 0,
            "value": None,
            "best": None,
            "params": format_params(params),
            "order": time.time(),
        }
        self._event(f"trial {number} started{note}: {self.rows[key]['params']}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        for key, entry in member_results(trial.trial_id, result):
            if key not in self.rows and isinstance(result.get("members"), list):  # joined a refilled cohort
                joined = self._ledger.trial_of(key)
                self._start_row(key, joined.params if joined is not None else {}, " (joined a population)")
                self._joined.setdefault(trial.trial_id, []).append(key)
            row = self.rows.get(key)
            if row is not None:
                row["round"], row["value"] = entry.get("round", row["round"]), entry.get(self.objective, row["value"])
        if isinstance(result.get("members"), list):  # members ASHA pruned at this result: closed in the study
            reported = {key for key, _ in member_results(trial.trial_id, result)}
            running = [k for k in self._member_rows(trial) if k in reported and self.rows[k]["state"] == "RUNNING"]
            states = {  # one read of the study per result
                t.user_attrs.get("tune_trial_id"): t.state.name for t in self._ledger.trials() if running
            }
            for key in running:
                if states.get(key) in FINISHED_STATES:
                    self._close_row(key, states[key], result)
        self._redraw()

    def _member_rows(self, trial: Any) -> list[str]:
        members = (trial.config or {}).get("members")
        keys = [str(m["id"]) for m in members] if isinstance(members, list) else [trial.trial_id]
        return [k for k in [*keys, *self._joined.get(trial.trial_id, [])] if k in self.rows]

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        last = dict(member_results(trial.trial_id, result))
        for key in self._member_rows(trial):
            if self.rows[key]["state"] == "RUNNING":
                self._close_row(key, None, last.get(key, {}))

    def _close_row(self, key: str, state: str | None, result: dict[str, Any]) -> None:
        row = self.rows[key]
        entry = dict(member_results(key, result)).get(key, result)
        row["round"], row["value"] = entry.get("round", row["round"]), entry.get(self.objective, row["value"])
        # the ledger closed the trial just before (Tune tells the searcher first); a trial it does
        # not hold (none of this driver's) shows what the ledger's rule would make of its result
        state = state or self._ledger.state_of(key)
        if state not in FINISHED_STATES:
            state = outcome(entry, False, [self.objective], self.max_rounds)[0]
        row["state"] = state
        if state == "COMPLETE" and self._ledger.feasible_of(key):  # never an infeasible best
            self._offer(row["value"], row["trial"])
        self._finish(row, f" ({entry['diverged']})" if entry.get("diverged") else "")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        for key in self._member_rows(trial):
            row = self.rows[key]
            if row["state"] == "RUNNING":
                row["state"] = self._ledger.state_of(key) or "FAIL"  # the searcher recorded the error
                self._finish(row, " (see the study's logs/ folder)")

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None
        _OPEN.discard(self)

    # ---- helpers -----------------------------------------------------------------------------
    def _number(self, tune_trial_id: str) -> int | str:
        """The Optuna trial number (as `autofl status` shows it); Tune's id if the ledger has no such trial."""
        number = self._ledger.number_of(tune_trial_id)
        return tune_trial_id if number is None else number

    def _offer(self, value: float | None, number: int | str) -> None:
        if value is not None and better(value, self.best[0] if self.best else None, self.mode):
            self.best = (value, number)

    def _progress(self) -> str:
        finished = self.finished_before + self.finished_now
        running = sum(r["state"] == "RUNNING" for r in self.rows.values())
        elapsed = time.time() - self.began
        remaining = max(self.requested - finished, 0)
        eta = (
            _clock(elapsed / self.finished_now * remaining)
            if self.finished_now and remaining
            else ("0:00" if not remaining else "-")
        )
        best = f"{self.objective}={self.best[0]:.4f} (trial {self.best[1]})" if self.best else "-"
        return (
            f"{finished}/{self.requested} trials finished, {running} running | elapsed {_clock(elapsed)}, "
            f"ETA {eta} | best {best}"
        )

    def _finish(self, row: dict[str, Any], note: str) -> None:
        self.finished_now += 1
        row["order"] = time.time()
        row["best"] = self.best[0] if self.best else None
        value = "-" if row["value"] is None else f"{row['value']:.4f}"
        self._event(
            f"trial {row['trial']} {row['state']} at round {row['round']}/{self.max_rounds}: "
            f"{self.objective}={value}{note} | {self._progress()}",
            force=True,
        )

    def _event(self, line: str, force: bool = False) -> None:
        if self._live is None:
            self.console.print(line, soft_wrap=True, highlight=False)
        else:
            self._redraw(force)

    def _redraw(self, force: bool = False) -> None:
        if self._live is not None and (force or time.time() - self._last_draw > 0.25):
            self._live.update(self._render())
            self._last_draw = time.time()

    def _render(self) -> Group:
        table = Table(
            "trial",
            "state",
            "round",
            self.objective,
            "best so far",
            "params",
            title=f"study {self._study.name}",
            title_justify="left",
        )
        running = [r for r in self.rows.values() if r["state"] == "RUNNING"]
        done = sorted((r for r in self.rows.values() if r["state"] != "RUNNING"), key=lambda r: -r["order"])
        for r in (running + done)[:MAX_ROWS]:
            table.add_row(
                str(r["trial"]),
                r["state"],
                f"{r['round']}/{self.max_rounds}",
                "-" if r["value"] is None else f"{r['value']:.4f}",
                "-" if r["best"] is None else f"{r['best']:.4f}",
                r["params"],
            )
        return Group(table, Text(self._progress()))

"""The Python API, and autofl's composition root: `train`, `search`, `load_study`, `Study`.

Everything the `autofl` command does is here: building an experiment from a config, starting Ray,
taking a study's driver lock, creating or resuming a study and running it, re-evaluating its best
configs, exporting and reporting. `autofl.cli` parses arguments, calls these and prints; a
notebook calls them directly:

    import autofl
    run = autofl.train({"method": {"name": "fedavg"}, "fl": {"rounds": 5}})
    study = autofl.search("search_spaces/quickstart.yaml", trials=8)
    autofl.train(study.best_config())

Configs and spaces may be dicts, pydantic objects (`Experiment`, `SearchSpace`) or YAML paths.
Bad input raises an `autofl.errors.AutoFLError` subclass (one line naming the field and what is
allowed, raised before any work starts); the CLI prints it and exits with its `exit_code`. Every
call's arguments are checked first, strictly (autofl/api_args.py): a wrongly typed one raises
`ArgumentError` naming it and what it allows, and nothing is written.

The study side is reached through `autofl.tuning` in one place (the `_store` functions below),
so that the study's owner can change without the API changing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autofl import api_args as args_
from autofl import slurm as jobs
from autofl.config import Experiment, apply_overrides, experiment_to_dict, read_yaml
from autofl.errors import AutoFLError, ConfigError, StorageError
from autofl.experiment import build_experiment
from autofl.files import write_atomic
from autofl.limits import check_reeval_size
from autofl.listing import cached_listing, keep_listing
from autofl.methods.registry import get_method_class
from autofl.report import build_report
from autofl.safe_yaml import load_text
from autofl.text import mask_url
from autofl.tuning.reeval import Run, load_summary, reevaluate
from autofl.tuning.store import study as store
from autofl.tuning.store.driver_lock import DriverLock
from autofl.tuning.store.ledger import shown_state
from autofl.tuning.store.storage import STORAGE_ENV, is_sqlite, open_storage, probe_storage
from autofl.tuning.strategy.constraints import feasibility_line
from autofl.tuning.strategy.space import SearchSpace, parse_space
from autofl.tuning.strategy.warm_start import apply as warm_apply
from autofl.tuning.strategy.warm_start import plan as warm_plan
from autofl.tuning.tune import preflight, ray_start  # by module: a test stands in for Ray by replacing their functions
from autofl.tuning.tune.experiment import StudyInterrupted
from autofl.tuning.tune.runner import run_study

if TYPE_CHECKING:
    import pandas

# ----- one run -----------------------------------------------------------------------------------


def load_config(
    config: dict[str, Any] | Experiment | str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Experiment:
    """The validated experiment of `config` (a dict, an `Experiment`, a YAML path, or None for the
    built-in default), with `key=value` overrides applied and its method's defaults filled in."""
    args_.check_args(args_.LoadConfigArgs, "load_config", overrides=overrides)
    if config is None:
        raw: dict[str, Any] = {}
    elif isinstance(config, Experiment):
        raw = experiment_to_dict(config)
    elif isinstance(config, dict):
        raw = config
    elif isinstance(config, (str, Path)):
        raw = read_yaml(config)
    else:
        raise ConfigError(
            f"config: {type(config).__name__} is not a config; allowed: a dict, an Experiment, "
            f"or the path of a YAML file"
        )
    return build_experiment(apply_overrides(raw, list(overrides)))


def default_run_dir(exp: Experiment) -> Path:
    """Where a run goes when no folder is given: autofl_runs/<method>-<time>."""
    return Path("autofl_runs") / f"{exp.method.name}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class RunResult:
    """One finished run: its evaluated rounds' metrics, the folder holding metrics.jsonl,
    config.yaml and final_state.pt, and the resolved experiment."""

    rounds: list[dict[str, float]]
    out: Path
    experiment: Experiment

    @property
    def final(self) -> dict[str, float]:
        """The last evaluated round's metrics."""
        return self.rounds[-1] if self.rounds else {}


def train(
    config: dict[str, Any] | Experiment | str | Path | None = None,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    overrides: list[str] | tuple[str, ...] = (),
    on_round: Callable[[dict[str, float], float], None] | None = None,
    announce: Callable[[str], None] | None = None,
    on_clients: Callable[[int], None] | None = None,
) -> RunResult:
    """Run one FL experiment to the end, as `autofl train` does, writing metrics.jsonl, config.yaml
    and final_state.pt to `out` (default autofl_runs/<method>-<time>; a folder holding files needs
    `overwrite`). `on_round(metrics, seconds)` sees each evaluated round, `announce` the executor
    line, `on_clients(n)` each batch of a round's clients finishing."""
    from autofl.training import run_training  # lazy: pulls torch

    args_.check_args(
        args_.TrainArgs,
        "train",
        out=out,
        overwrite=overwrite,
        overrides=overrides,
        on_round=on_round,
        announce=announce,
        on_clients=on_clients,
    )
    if isinstance(out, str) and not out.strip():
        raise AutoFLError("--out: empty; give a folder, or leave --out out for autofl_runs/<method>-<time>")
    exp = load_config(config, overrides)
    folder = Path(out) if out is not None else default_run_dir(exp)
    history = run_training(exp, folder, on_round, overwrite, announce, on_clients)

    keep_listing()  # the registries are loaded: the first `autofl list` after it imports no torch
    return RunResult(rounds=history, out=folder, experiment=exp)


# ----- spaces ------------------------------------------------------------------------------------


def search_space(space: dict[str, Any] | SearchSpace | str | Path) -> tuple[SearchSpace, str]:
    """The validated space and the text a new study keeps as its space.yaml (a file's own text,
    comments included; a dict's or a SearchSpace's YAML)."""
    if isinstance(space, (str, Path)):
        path, parsed = store.ensure_space_file(str(space))
        return parsed, path.read_text()
    if isinstance(space, SearchSpace):
        raw = space.model_dump(mode="json", exclude_unset=True)
    elif isinstance(space, dict):
        raw = space
    else:
        raise ConfigError(
            f"space: {type(space).__name__} is not a search space; allowed: a dict, a SearchSpace, "
            f"or the path of a YAML file"
        )
    parsed = parse_space(raw, "space")
    return parsed, yaml.safe_dump(raw, sort_keys=False)


# ----- studies -----------------------------------------------------------------------------------


class Study:
    """A study folder: its space, its trials (Optuna's records, read on every call, so a study
    another process is running shows its progress), its best config, re-evaluation and report.
    Open one with `autofl.load_study(name)`; `autofl.search(...)` returns one."""

    def __init__(self, folder: Any):
        self._folder = folder  # autofl.tuning.store.study.StudyFolder

    def __repr__(self) -> str:
        return f"Study({self.name!r}, root={str(self.root)!r})"

    @property
    def name(self) -> str:
        return self._folder.name

    @property
    def root(self) -> Path:
        return self._folder.root

    @property
    def space(self) -> SearchSpace:
        return self._folder.space()

    @property
    def stored_space(self) -> SearchSpace:
        """The space as the study's own copy holds it, read without building experiments (no torch):
        what read-only views use; `space` is the same space validated in full."""
        return self._folder.stored_space()

    @property
    def storage_url(self) -> str:
        """The Optuna storage URL (without password)."""
        return self._folder.storage_url()

    @property
    def record(self) -> dict[str, Any]:
        """The study's record: what was fixed when it was made (study.json: storage, default sampler,
        warm start) and what its runs changed (the ledger's: runs, trials_requested, root)."""
        return {**self._folder.meta(), **store.study_record(self._folder, snapshot=not self.driver_running())}

    @property
    def runs(self) -> list[dict[str, Any]]:
        """The study's driver runs (Tune experiments): name, trials asked for, Tune wall seconds."""
        return list(self.record["runs"])

    def driver_running(self) -> bool:
        """Whether a main driver (`autofl search` or a re-evaluation) holds the study now."""
        return DriverLock(self.root).is_held()

    def trials(self) -> list[dict[str, Any]]:
        """One dict per trial: number, state (as `autofl status` shows it: INTERRUPTED for what a
        stopped driver left), optuna_state, params, round (last reported), objective, values
        (multi-objective), user_attrs."""
        live = self.driver_running()
        rows = store.trial_rows(self._folder, snapshot=not live)  # an idle study's rows may come from its snapshot
        return [
            {**r, "optuna_state": r["state"], "state": shown_state(r["state"], r["user_attrs"], live)} for r in rows
        ]

    def best_row(self) -> dict[str, Any]:
        """The best COMPLETE trial (first objective) that meets the space's constraints, as a row of
        `trials()` (state as Optuna has it); AutoFLError if none. Read as `trials()` reads (an idle
        study's snapshot: no Optuna import)."""
        return store.best_row(self._folder, self._optuna_rows())

    def _optuna_rows(self) -> list[dict[str, Any]]:
        return store.with_optuna_states(self.trials())

    @property
    def storage_shown(self) -> str:
        """The storage URL as it may be printed: a password in it is `***`."""
        return mask_url(self.storage_url)

    def best_objective(self, rows: list[dict[str, Any]] | None = None) -> float | None:
        """The best feasible COMPLETE trial's (first) objective among `rows` (`trials()`' rows,
        default read now), or None where there is none."""
        args_.check_args(args_.RowsArgs, "best_objective", rows=rows)
        return store.best_row_value(
            store.with_optuna_states(self.trials() if rows is None else rows), self.stored_space.mode
        )

    def feasibility_line(self, rows: list[dict[str, Any]] | None = None) -> str | None:
        """A constrained study's constraints and how many completed trials meet them (None for a study
        without constraints), from `trials()`' rows (default read now)."""
        args_.check_args(args_.RowsArgs, "feasibility_line", rows=rows)
        constraints = self.stored_space.constraints
        if not constraints:
            return None
        return feasibility_line(constraints, store.with_optuna_states(self.trials() if rows is None else rows))

    def pareto_rows(self, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """A multi-objective study's Pareto front as rows of `trials()` (default read now), best first
        objective first: `pareto_trials()` without an Optuna import."""
        args_.check_args(args_.RowsArgs, "pareto_rows", rows=rows)
        return store.pareto_rows(self.trials() if rows is None else rows, self.stored_space.mode)

    def trials_line(self) -> str:
        """Where and how the study's trials train (the executor, its device, the resources chosen
        by `gpu: auto`), as `autofl search` prints it when Ray is up; reads the resolved space."""
        from autofl.accel.choice import describe_executor  # lazy: pulls torch
        from autofl.device import resolve_device  # lazy: pulls torch

        space = self.space
        base = space.base_experiment()
        trial_device = resolve_device("cuda" if space.resources.gpu_share > 0 else "cpu")  # where Ray places the trials
        line = describe_executor(base, get_method_class(base.method.name), trial_device)
        return f"{line}; {space.resources.auto_line}" if space.resources.auto_line else line

    def serve_dashboard(self, port: int, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve optuna-dashboard on the study's storage at 127.0.0.1:`port` until interrupted
        (`autofl dashboard`); `on_ready(line)` is called with what it serves before it blocks. A
        missing extra or a taken port is one line (AutoFLError), before the server starts."""
        args_.check_args(args_.DashboardArgs, "serve_dashboard", port=port, on_ready=on_ready)
        try:
            import optuna_dashboard
        except ImportError:
            raise AutoFLError(
                "dashboard: optuna-dashboard is not installed; install the extra with "
                'pip install -e ".[dashboard]" (or pip install optuna-dashboard)'
            ) from None

        storage = open_storage(self.storage_url)
        preflight.check_port(port)  # a taken or impossible port is one line, before the server starts
        if on_ready is not None:
            on_ready(
                f"optuna-dashboard for study {self.name} ({self.storage_shown}) on "
                f"http://127.0.0.1:{port}/dashboard/ ; Ctrl-C stops it"
            )
        optuna_dashboard.run_server(storage, host="127.0.0.1", port=port)  # this machine only

    def optuna_trials(self) -> list:
        """Optuna's FrozenTrials of the study (its constraint values in `.constraints`)."""
        ot = self._folder.load_optuna()
        return ot.get_trials(deepcopy=False) if ot is not None else []

    def counts(self) -> dict[str, int]:
        """Trials per state, as `autofl status` counts them."""
        return store.state_counts(self.trials())

    def trials_dataframe(self) -> pandas.DataFrame:
        """Optuna's `trials_dataframe()` (number, value(s), params_*, user_attrs_*, state ...) plus
        autofl's columns: `autofl_state` (as `autofl status` shows it), `round` (the last
        reported) and `objective` (the final value, else the last round's)."""
        import pandas

        ot = self._folder.load_optuna()
        frame = ot.trials_dataframe() if ot is not None else pandas.DataFrame()
        if frame.empty:
            return frame
        extra = pandas.DataFrame(
            [
                {"number": r["number"], "autofl_state": r["state"], "round": r["round"], "objective": r["objective"]}
                for r in self.trials()
            ]
        )
        return frame.merge(extra, on="number", how="left")

    def best_trial(self):
        """Optuna's FrozenTrial of the best COMPLETE trial (first objective) that meets the space's
        constraints; AutoFLError if none (saying so where trials completed but none is feasible)."""
        return store.best_trial(self._folder)

    def best_value(self) -> float | None:
        return store.first_value(self.best_trial())

    def pareto_trials(self) -> list:
        """A multi-objective study's Pareto front (FrozenTrials), best first objective first."""
        return store.pareto_trials(self._folder)

    def reeval_summary(self) -> dict[str, Any] | None:
        """The stored re-evaluation summary (`reevaluate`'s result), or None."""
        return load_summary(self._folder)

    def best_config(self, reeval: dict[str, Any] | None = None) -> dict[str, Any]:
        """A complete config of the best trial, runnable by `autofl.train` (what `autofl best-config
        export` writes). With a re-evaluation (`reeval`, default the stored one) the best candidate
        by mean over its seeds, with the verdict in its metadata."""
        args_.check_args(args_.BestConfigArgs, "best_config", reeval=reeval)
        rows = self._optuna_rows()
        store.best_row(self._folder, rows)  # a study without a completed trial fails here
        return store.export_best_config(self._folder, rows, reeval if reeval is not None else self.reeval_summary())

    def pareto_front(self) -> dict[str, Any]:
        """A multi-objective study's Pareto front: per trial its values and its runnable config."""
        return store.export_pareto(self._folder)

    def reevaluate(
        self,
        seeds: int = 5,
        top: int = 3,
        *,
        vary_partition: bool = False,
        address: str | None = None,
        verbose: bool = False,
        on_plan: Callable[[int, int], None] | None = None,
        on_done: Callable[[Run, dict], None] | None = None,
    ) -> dict[str, Any]:
        """Re-run the `top` best configs and the paper default over `seeds` fresh seeds as Ray
        trials (runs already done are reused), as `autofl reeval` does; returns the summary (per
        candidate mean, std and 95% CI, the paired difference to the default, `best`, `verdict`).
        `on_plan(missing, total)` is called before Ray starts, `on_done(run, metrics)` per run."""
        args_.check_args(
            args_.ReevaluateArgs,
            "reevaluate",
            seeds=seeds,
            top=top,
            vary_partition=vary_partition,
            address=address,
            verbose=verbose,
            on_plan=on_plan,
            on_done=on_done,
        )
        check_reeval_size(seeds, top)
        folder = self._folder
        folder.space()  # validate before Ray starts
        store.check_owned(folder.root)  # the lock file and run records are written into it
        preflight.probe_address(address)  # an unreachable cluster: one line in seconds
        lock = DriverLock(folder.root)
        lock.acquire(sqlite=is_sqlite(folder.storage_url()))

        def plan(missing: int, total: int) -> None:
            if on_plan is not None:
                on_plan(missing, total)
            if missing:  # Ray starts only when there is something to run
                ray_start.start_ray(folder.root, address, verbose)
                preflight.sigterm_as_ctrl_c()  # after Ray's own driver handler
                resources = folder.space().resolve_resources(population=False).resources  # none of its runs could start
                preflight.check_cluster_fits(resources.cpu, resources.gpu_share, address)  # on a cluster without them

        try:
            summary = reevaluate(
                folder, seeds, top, vary_partition, address, on_done=on_done or (lambda run, result: None), on_plan=plan
            )
            _leave_for_readers(folder)  # it wrote the summary into the storage
            return summary
        finally:
            lock.release()

    def report(self, out: str | Path | None = None) -> Path:
        """Write the study's HTML report (self-contained) and its figures as PNG into `out`
        (default <study>/report); returns the HTML file's path."""
        args_.check_args(args_.ReportArgs, "report", out=out)
        folder = Path(out) if out is not None else self.root / "report"
        if folder.exists() and not folder.is_dir():
            raise AutoFLError(f"-o {folder}: is a file; give a folder for report.html and its PNG figures")
        if out is None:  # written into the study folder: only one this user owns, never through a planted link
            store.check_owned(self.root)
            if folder.is_symlink():
                raise AutoFLError(f"{folder}: is a symbolic link; remove it, or give -o FOLDER for the report")
        try:
            return build_report(self._folder, folder)
        except OSError as err:
            raise AutoFLError(
                f"-o {folder}: cannot be written ({err.strerror}); give -o a folder you may write"
            ) from None


def studies_dir(dir: str | Path | None = None) -> Path:
    """The studies folder: `dir`, else $AUTOFL_HOME, else ./autofl_studies."""
    args_.check_args(args_.DirArgs, "studies_dir", dir=dir)
    return store.studies_dir(str(dir) if dir is not None else None)


def list_studies(dir: str | Path | None = None) -> list[str]:
    """The names of the studies in the studies folder."""
    args_.check_args(args_.DirArgs, "list_studies", dir=dir)
    return store.existing_studies(studies_dir(dir))


def skipped_study_folders(dir: str | Path | None = None) -> list[str]:
    """Folders in the studies folder that hold a study's files under a name no study may have
    (a copy made as `cp -r qs1 "qs1 backup"`): `list_studies` leaves them out."""
    args_.check_args(args_.DirArgs, "skipped_study_folders", dir=dir)
    return store.study_folders(studies_dir(dir))[1]


def study_name_rule() -> str:
    """What a study's name may be (the rule every name is checked against)."""
    return store.STUDY_NAME_RULE


def config_text(config: dict[str, Any], fmt: str = "yaml") -> str:
    """An exported config (`Study.best_config()`, `Study.pareto_front()`) as the text `autofl
    best-config export` writes: `fmt` yaml or json."""
    args_.check_args(args_.ConfigTextArgs, "config_text", config=config, fmt=fmt)
    return store.dump_config(config, fmt)


def list_entries(kinds: list[str]) -> list[Any]:
    """What `autofl list` shows of `kinds` (methods, models, datasets): one `autofl.listing.Listed`
    per registered entry (name, source, facts, parameters), kept between calls (autofl/listing.py)."""
    args_.check_args(args_.ListEntriesArgs, "list_entries", kinds=kinds)
    return cached_listing(kinds)


def slurm_options(given: dict[str, Any], flags: bool = False) -> Any:
    """`given` (SlurmOptions' fields) checked into an `autofl.slurm.SlurmOptions`; with `flags`, a bad
    value's line names the CLI flag (--cpus-per-node) rather than the field."""
    args_.check_args(args_.SlurmOptionsArgs, "slurm_options", given=given, flags=flags)
    return jobs.parse_options(given, flags=flags)


def release_sigterm() -> None:
    """For a program that owns its process (the CLI), once its command is done: SIGTERM ends the
    process at once again, instead of stopping a study as Ctrl-C does (autofl/tuning/tune/preflight.py)."""
    preflight.sigterm_ends_the_process()


def load_study(name: str, dir: str | Path | None = None) -> Study:
    """An existing study by name; AutoFLError listing the existing ones if there is none."""
    args_.check_args(args_.LoadStudyArgs, "load_study", name=name, dir=dir)
    return Study(store.open_study(studies_dir(dir), name))


def _import_trial_stack() -> None:
    import optuna  # noqa: F401

    import autofl.tuning.tune.searcher  # lazy: pulls ray (imported while Ray starts)
    import autofl.tuning.tune.trainable  # noqa: F401  # lazy: pulls torch, ray.tune, the engine


def search(
    space: dict[str, Any] | SearchSpace | str | Path | None = None,
    *,
    name: str | None = None,
    trials: int | None = None,
    dir: str | Path | None = None,
    address: str | None = None,
    resume: bool = False,
    join: bool = False,
    storage_path: str | None = None,
    warm_start: str | None = None,
    verbose: bool = False,
    on_start: Callable[[Study, Path], None] | None = None,
) -> Study:
    """Run a hyperparameter study on Ray Tune (started locally, or the cluster at `address`) and
    return it, as `autofl search` does.

    New study: `space` (a dict, a SearchSpace or a YAML path), named `name` or the space's `study`,
    created in `dir` (default $AUTOFL_HOME or ./autofl_studies), `trials` overriding the space's.
    `resume=True`: continue the study `name` (no space: it keeps its own): finish its interrupted run,
    then add `trials` more if given. `join=True`: one more driver on a running PostgreSQL or journal study.
    `warm_start`: a new study begins with the finished trials of that other study (in the same
    folder) that fit its space; they train nothing and count against no budget
    (autofl/tuning/strategy/warm_start.py; the line saying what was taken is `study.record["warm_start"]`).
    `on_start(study, logs_folder)` is called once Ray is up, before the first trial. Ctrl-C raises
    StudyInterrupted (the study resumes with `resume=True`)."""
    args_.check_args(
        args_.SearchArgs,
        "search",
        name=name,
        trials=trials,
        dir=dir,
        address=address,
        resume=resume,
        join=join,
        storage_path=storage_path,
        warm_start=warm_start,
        verbose=verbose,
        on_start=on_start,
    )
    if trials is not None and trials < 1:
        raise AutoFLError(f"trials: {trials}; allowed: 1 or more")
    if resume and join:
        raise AutoFLError("search: give --resume NAME or --join NAME, not both")
    existing = resume or join
    warm = None
    if existing and storage_path:
        raise AutoFLError("--storage-path: applies to a new study; an existing one keeps the place it was made with")
    if existing and warm_start is not None:
        raise AutoFLError(
            f"--warm-start: applies to a new study; --resume/--join {name} continues the study with the trials it has"
        )
    if existing and space is not None:
        raise AutoFLError(
            f"--space: applies to a new study; --resume/--join {name} continues the study with its own space and name"
        )
    if name is not None and not name.strip():
        raise AutoFLError("--name: empty; give a study name, or leave --name out for the space's `study`")
    home = studies_dir(dir)
    preflight.probe_address(address)  # an unreachable cluster: one line in seconds, before any folder exists
    if existing:
        if name is None:
            raise AutoFLError("search: resume=True or join=True needs the study's name")
        folder = store.open_study(home, name)
        store.check_owned(folder.root)  # Tune unpickles from it
        folder.space()  # validate before Ray starts
    else:
        if space is None:
            raise AutoFLError("search: give --space FILE for a new study or --resume NAME to continue one")
        parsed, text = search_space(space)
        base = parsed.base_experiment()
        # a missing or corrupt dataset, or a split that gives no client a validation sample, fails
        # before the study exists (loaded once: the trials share this load)
        from autofl.data.datasets import load_raw_dataset  # lazy: pulls torch
        from autofl.data.federated import build_federated  # lazy: pulls torch

        build_federated(load_raw_dataset(base.data), base.data, base.data_seed())
        storage_path = preflight.check_new_study(parsed, storage_path)
        preflight.check_home(home)
        if warm_start is not None:  # read only: an unknown study or the study itself is refused here
            warm = warm_plan(
                home, warm_start, store.check_study_name(name or parsed.study, "--name" if name else "study"), parsed
            )
        folder = store.create_study(home, None, parsed, name, storage_path=storage_path, space_text=text)
    sqlite = is_sqlite(folder.storage_url())
    if existing and not sqlite:  # a new study's storage was probed before its folder was made
        probe_storage(folder.storage_url())
    lock = DriverLock(folder.root)
    if join:
        if sqlite:
            raise StorageError(
                f"--join {folder.name}: the study is on SQLite, which takes one driver; create it "
                f"with PostgreSQL or journal storage (space `storage:` or AUTOFL_STORAGE) to run several"
            )
    else:
        lock.acquire(sqlite=sqlite)
    try:
        _run_study(folder, trials, address, resume, join, verbose, on_start, created=not existing, lock=lock, warm=warm)
        if not join:  # while the lock is held: no other driver writes the study meanwhile
            _leave_for_readers(folder)
    finally:
        lock.release()
    return Study(folder)


def _leave_for_readers(folder: Any) -> None:
    """What the read-only commands would read slowly, left by a driver that has Optuna and the
    registries loaded (issue 42): the study's trial rows (`autofl status` and `studies` then import
    no Optuna) and `autofl list`'s rows (no torch). Both are caches: a failure leaves them unwritten
    and the readers read the storage and the registries themselves."""
    with contextlib.suppress(Exception):  # a cache: the study is whole in its storage either way
        store.keep_trial_rows(folder)
    keep_listing()


def _run_study(
    folder: Any,
    trials: int | None,
    address: str | None,
    resume: bool,
    join: bool,
    verbose: bool,
    on_start: Callable[[Study, Path], None] | None,
    created: bool,
    lock: Any,
    warm: Any = None,
) -> None:
    """Start Ray and run the study's trials: the one place the API drives the tuning package."""
    # a failed start leaves no half-made study
    with preflight.rollback_if_unstarted(folder, created=created, lock=lock):
        if warm is not None:  # the other study's trials, added before the first proposal
            warm_apply(folder, warm)

        # Ray's processes start while this thread waits on them: meanwhile import the trial stack
        # (measured on 2 cores: the quickstart's start-up overlaps by about 1.5 s) and resolve the space's
        # resources once, which needs no Ray (`population: auto`'s dry rounds overlap Ray's start)
        def meanwhile() -> None:
            _import_trial_stack()
            folder.space().resolve_resources(recorded_population=store.recorded_width(folder), trials=trials)

        logs = ray_start.start_ray(folder.root, address, verbose, meanwhile=meanwhile)
        space = folder.space()  # the space object every later step reads, its resources resolved
        preflight.check_cluster_fits(space.resources.cpu, space.resources.gpu_share, address)
    preflight.sigterm_as_ctrl_c()  # after Ray's own driver handler: SIGTERM stops the run as Ctrl-C does
    try:
        if on_start is not None:
            on_start(Study(folder), logs)
        run_study(folder, trials, address, resume=resume, join_shared=join)
    except KeyboardInterrupt:
        # Tune stops gracefully on the first Ctrl-C while it runs and settle_run says so; a Ctrl-C
        # outside Tune's loop (after it returned, while the run is settled; or a second one) is a
        # KeyboardInterrupt here. The trials are in the study's storage either way and --resume
        # finishes the run (CI saw a bare "interrupted" from a Ctrl-C just after the last trial).
        raise StudyInterrupted.of(folder.name) from None


# ----- SLURM ---------------------------------------------------------------------------------------


def submit_slurm(
    space: dict[str, Any] | SearchSpace | str | Path | None = None,
    *,
    name: str | None = None,
    resume: bool = False,
    trials: int | None = None,
    dir: str | Path | None = None,
    options: Any = None,
    dry_run: bool = False,
) -> Any:
    """Run a study as a SLURM batch job, as `autofl slurm` does: a Ray cluster on the job's nodes
    (a head on the first, a worker on each other), the study driven on it, Ray stopped at the end;
    near the time limit the study is saved and the job requeued to resume it (autofl/slurm.py).

    New study: `space` (named `name` or the space's `study`, `trials` overriding the space's) is
    created in `dir` now, on a journal file in its folder unless the space or AUTOFL_STORAGE names
    a storage. `resume=True`: submit a job that resumes the existing study `name`. `options`: a
    `autofl.slurm.SlurmOptions` or its dict (nodes, cpus_per_node, gpus_per_node, time, ...).
    `dry_run=True` creates and submits nothing. Returns an `autofl.slurm.Submission` (the script,
    where it is written, the job id)."""
    args_.check_args(args_.SlurmArgs, "submit_slurm", name=name, resume=resume, trials=trials, dir=dir, dry_run=dry_run)
    opts = jobs.parse_options(options)
    home = studies_dir(dir)
    if resume:
        if space is not None:
            raise AutoFLError(
                f"--space: applies to a new study; --resume {name} continues the study with its own space"
            )
        if trials is not None:
            raise AutoFLError(
                "--trials: applies to a new study here (every requeued run would add them again); "
                "add trials with autofl search --resume NAME --trials N, then submit --resume NAME"
            )
        if name is None:
            raise AutoFLError("slurm: resume=True needs the study's name")
        folder = store.open_study(home, name)
        store.check_owned(folder.root)
        parsed, text = folder.space(), None
    else:
        if space is None:
            raise AutoFLError("slurm: give --space FILE for a new study or --resume NAME to continue one")
        if name is not None and not name.strip():
            raise AutoFLError("--name: empty; give a study name, or leave --name out for the space's `study`")
        parsed, text = search_space(space)
        name = store.check_study_name(name or parsed.study, "--name" if name else "study")
        if (home / name / store.SPACE_FILE).exists():
            raise AutoFLError(
                f"study {name!r} already exists in {home}; submit it with --resume {name}, or pick another --name"
            )
        # a missing or corrupt dataset, or a split that gives no client a sample, fails now, not on
        # the cluster (as `search` checks it)
        from autofl.data.datasets import load_raw_dataset  # lazy: pulls torch
        from autofl.data.federated import build_federated  # lazy: pulls torch

        base = parsed.base_experiment()
        build_federated(load_raw_dataset(base.data), base.data, base.data_seed())
        preflight.check_new_study(parsed, None)
        preflight.check_home(home)
    # `gpu: auto` is resolved by the job's driver on its node (a share of one card, or 0 without one)
    gpu = parsed.resources.gpu
    jobs.check_fits(opts, float(parsed.resources.cpu), 0.0 if gpu == "auto" else float(gpu))
    root = home / name
    script = jobs.render_script(root, opts)
    path = root / jobs.SLURM_DIR / jobs.SCRIPT_FILE
    if dry_run:
        return jobs.Submission(name, script, path, None)
    jobs.sbatch_command()  # no SLURM here: one line before anything is made
    created = not root.exists()
    if text is not None:  # a new study (resume has no text)
        tree = load_text(text)  # bounded, as the space was read
        changed: dict[str, Any] = {}
        if parsed.storage is None and not os.environ.get(STORAGE_ENV):
            changed["storage"] = jobs.DEFAULT_JOURNAL  # SQLite is not safe on a shared filesystem
        if trials is not None:
            changed["trials"] = trials
        if changed:
            tree = {**tree, **changed}
            text = f"# written by autofl slurm ({', '.join(changed)} set)\n" + yaml.safe_dump(tree, sort_keys=False)
            parsed = parse_space(tree, "space")
        store.create_study(home, None, parsed, name, space_text=text)
    try:
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, script)
        path.chmod(0o755)
        job = jobs.submit_script(path)
    except BaseException:
        if created:  # a failed submission leaves no half-made study
            shutil.rmtree(root, ignore_errors=True)
        raise
    return jobs.Submission(name, script, path, job)

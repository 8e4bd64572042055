"""The `autofl` command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autofl.errors import AutoFLError, StorageError
from autofl.text import clean, terminal_console

# no rich markup in printed user text; 200 columns in a pipe or CI log (autofl/text.py)
console = terminal_console()
err_console = terminal_console(stderr=True)

_ROUND_COLUMNS = ("round", "train_loss", "personal_val_acc", "personal_test_acc", "global_val_acc", "global_test_acc")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else clean(value)


def cmd_train(args: argparse.Namespace) -> int:
    from autofl.experiment import load_experiment
    from autofl.train import run_training

    if args.out is not None and not args.out.strip():
        raise AutoFLError("--out: empty; give a folder, or leave --out out for autofl_runs/<method>-<time>")
    exp = load_experiment(args.config, args.set)
    out = Path(args.out) if args.out else Path("autofl_runs") / f"{exp.method.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"autofl train: {exp.method.name} on {exp.data.dataset} ({exp.data.num_clients} clients, "
                  f"{exp.data.partition.kind}), {exp.model.arch}, {exp.fl.rounds} rounds -> {out}")
    table = Table(*_ROUND_COLUMNS, "seconds", title=f"{exp.method.name} / {exp.data.dataset}")
    # within a round: clients trained so far (a long round shows it is moving)
    per_round = exp.clients_per_round()
    progress = Progress(TextColumn("round {task.fields[rnd]}/" + str(exp.fl.rounds)), BarColumn(),
                        MofNCompleteColumn(), TextColumn("clients"), TimeElapsedColumn(), console=console)
    task = progress.add_task("clients", total=per_round, rnd=1)
    live = Live(Group(table, progress), console=console, refresh_per_second=4) if console.is_terminal else None
    clients = [0, 1]  # trained in this round, the round

    def on_clients(done: int) -> None:
        clients[0] += done
        if clients[0] >= per_round and clients[1] < exp.fl.rounds:  # the next round starts from 0
            clients[0], clients[1] = 0, clients[1] + 1
        progress.update(task, completed=min(clients[0], per_round), rnd=clients[1])

    def on_round(metrics: dict[str, float], seconds: float) -> None:
        row = [_fmt(metrics.get(k)) for k in _ROUND_COLUMNS] + [f"{seconds:.1f}"]
        if live is not None:
            table.add_row(*row)
        else:
            console.print("  ".join(f"{k}={v}" for k, v in zip((*_ROUND_COLUMNS, "seconds"), row)), soft_wrap=True)

    announce = lambda line: console.print(line, soft_wrap=True)  # noqa: E731
    if live is not None:
        with live:
            history = run_training(exp, out, on_round, args.overwrite, announce, on_clients)
    else:
        history = run_training(exp, out, on_round, args.overwrite, announce)
    last = history[-1]
    console.print(f"done: personal_test_acc={_fmt(last.get('personal_test_acc'))} "
                  f"personal_val_acc={_fmt(last.get('personal_val_acc'))}; wrote {out}/metrics.jsonl, config.yaml, "
                  f"final_state.pt", soft_wrap=True)
    return 0


def _import_trial_stack() -> None:
    import optuna  # noqa: F401

    import autofl.search.searcher  # noqa: F401  (ray.tune's search package)
    import autofl.search.trainable  # noqa: F401  (torch, ray.tune, the engine)


def cmd_search(args: argparse.Namespace) -> int:
    from autofl.search import study as st

    from autofl.search.driver_lock import DriverLock
    from autofl.search.storage import is_sqlite, probe_storage

    home = st.studies_dir(args.dir)
    existing = args.resume or args.join
    if args.resume and args.join:
        raise AutoFLError("search: give --resume NAME or --join NAME, not both")
    if existing and args.storage_path:
        raise AutoFLError("--storage-path: applies to a new study; an existing one keeps the place it was made with")
    for flag, given in (("--space", args.space), ("--name", args.name)):
        if existing and given is not None:
            raise AutoFLError(f"{flag}: applies to a new study; --resume/--join {existing} continues the study "
                              f"with its own space and name")
    if args.name is not None and not args.name.strip():
        raise AutoFLError("--name: empty; give a study name, or leave --name out for the space's `study`")
    from autofl.search.preflight import (check_cluster_fits, check_home, check_new_study, probe_address,
                                         rollback_if_unstarted, sigterm_as_ctrl_c)

    probe_address(args.address)  # an unreachable cluster: one line in seconds, before any folder exists
    if existing:
        study = st.open_study(home, existing)
        st.check_owned(study.root)  # Tune unpickles from it
        study.space()  # validate before Ray starts
    else:
        if not args.space:
            raise AutoFLError("search: give --space FILE for a new study or --resume NAME to continue one")
        space_path, space = st.ensure_space_file(args.space)
        data = space.base_experiment().data
        if data.dataset != "digits":  # a missing or corrupt dataset fails before the study exists (loaded once:
            from autofl.data.datasets import load_raw_dataset  # the trials share this load); digits has no files

            load_raw_dataset(data)
        args.storage_path = check_new_study(space, args.storage_path)
        check_home(home)
        study = st.create_study(home, space_path, space, args.name, storage_path=args.storage_path)
    sqlite = is_sqlite(study.storage_url())
    if existing and not sqlite:  # a new study's storage was probed before its folder was made
        probe_storage(study.storage_url())
    lock = DriverLock(study.root)
    if args.join:
        if sqlite:
            raise StorageError(f"--join {study.name}: the study is on SQLite, which takes one driver; create it "
                               f"with PostgreSQL storage (space `storage:` or AUTOFL_STORAGE) to run several")
    else:
        lock.acquire(sqlite=sqlite)
    from autofl.search.ray_start import start_ray
    from autofl.search.runner import run_study

    # Ray's processes start while this thread waits on them: import the trial stack meanwhile
    # (measured on 2 cores: the quickstart's start-up overlaps by about 1.5 s)
    with rollback_if_unstarted(study, created=not existing, lock=lock):  # a failed start leaves no half-made study
        logs = start_ray(study.root, args.address, args.verbose, meanwhile=_import_trial_stack)
        space = study.space()
        check_cluster_fits(space.resources.cpu, space.resources.gpu, args.address)
    sigterm_as_ctrl_c()  # after Ray's own driver handler: SIGTERM stops the run as Ctrl-C does
    from autofl.device import resolve_device
    from autofl.engine.executor import describe_executor
    from autofl.methods.registry import get_method_class

    base = space.base_experiment()
    trial_device = resolve_device("cuda" if space.resources.gpu > 0 else "cpu")  # where Ray places the trials
    console.print(f"autofl search: study {study.name} in {study.root}; trials' "
                  f"{describe_executor(base, get_method_class(base.method.name), trial_device)}"
                  f"{'; ' + space.resources.auto_line if space.resources.auto_line else ''}; Ray's logs: {logs}"
                  f"{' (also shown here)' if args.verbose else ''}", soft_wrap=True)
    record_before = study.meta()  # unchanged after a --resume that found nothing to do
    try:
        run_study(study, args.trials, args.address, resume=bool(args.resume), join_shared=bool(args.join))
    finally:
        lock.release()
    _print_status(study)
    if args.resume and not args.trials and study.meta() == record_before:
        console.print(f"study {study.name} has run all its trials; add more with: autofl search --resume "
                      f"{study.name} --trials N", soft_wrap=True)
    if not any(r["state"] in ("COMPLETE", "PRUNED") for r in st.trial_rows(study)):
        err_console.print(f"autofl: error: study {study.name} has no finished trial (every trial failed or none "
                          f"ran); see autofl status {study.name} and {study.root / 'logs'}", soft_wrap=True)
        return 1
    try:
        best = st.best_trial(study)
        console.print(f"best trial #{best.number}: {study.space().objective}={st.first_value(best):.4f} "
                      f"params={best.params}", soft_wrap=True)
        if study.space().multi_objective:
            console.print(f"export the Pareto front with: autofl best-config export {study.name} --pareto "
                          f"-o front.yaml", soft_wrap=True)
        else:
            console.print(f"export it with: autofl best-config export {study.name} -o best.yaml", soft_wrap=True)
    except AutoFLError as err:
        console.print(str(err))
    return 0


def display_state(row: dict, live_driver: bool) -> str:
    """The state the ledger shows for a trial row (INTERRUPTED for one a killed driver left)."""
    from autofl.search.ledger import shown_state

    return shown_state(row["state"], row["user_attrs"], live_driver)


def display_counts(rows: list[dict], live_driver: bool) -> dict[str, int]:
    from autofl.search.study import state_counts

    return state_counts([{**r, "state": display_state(r, live_driver)} for r in rows])


def _print_status(study) -> None:
    from autofl.search.driver_lock import DriverLock
    from autofl.search.storage import mask_url
    from autofl.search.study import trial_rows

    rows = trial_rows(study)
    live_driver = DriverLock(study.root).is_held()
    space = study.space()
    table = Table("trial", "state", "round", " / ".join(space.metrics), "node", "params", "note",
                  title=f"study {study.name}")
    for r in rows:
        params = ", ".join(f"{k.split(':')[-1]}={_fmt(v)}" for k, v in r["params"].items())
        state = display_state(r, live_driver)
        node = str(r["user_attrs"].get("node_id") or "-")[:8]
        value = " / ".join(map(_fmt, r["values"])) if space.multi_objective and r["values"] else _fmt(r["objective"])
        table.add_row(str(r["number"]), state, _fmt(r["round"]), value, node, params,
                      str(r["user_attrs"].get("fail_reason", "")))
    console.print(table)
    console.print(f"storage: {mask_url(study.storage_url())}", soft_wrap=True)
    if space.multi_objective:
        from autofl.search.study import pareto_trials

        front = pareto_trials(study)
        goals = ", ".join(f"{m} ({d})" for m, d in zip(space.metrics, space.modes or []))
        console.print(f"Pareto front of {goals}: " + ("; ".join(
            f"trial {t.number} ({' / '.join(map(_fmt, t.values))})" for t in front) or "none yet"), soft_wrap=True)
    if space.budget_rounds is not None:
        used = sum(r["round"] or 0 for r in rows)  # each trial's last reported round, as the budget counts
        console.print(f"budget: {used} of {space.budget_rounds} FL rounds used (budget_rounds)")
    if space.time_budget_s is not None:
        walls = [run.get("tune_wall_s", 0.0) for run in study.meta()["runs"]]
        console.print(f"budget: runs took {', '.join(f'{w:.0f} s' for w in walls) or 'none'} of "
                      f"{space.time_budget_s:.0f} s each (time_budget_s)")
    counts = display_counts(rows, live_driver)
    console.print("trials: " + (", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())) or "none"))
    from autofl.search.reeval import load_summary

    summary = load_summary(study)
    if summary is not None:
        from autofl.views import reeval_table

        console.print(reeval_table(summary))
        console.print(f"verdict: {summary['verdict']}", soft_wrap=True)


def cmd_studies(args: argparse.Namespace) -> int:
    from autofl.search import study as st

    home = st.studies_dir(args.dir)
    names = st.existing_studies(home)
    if not names:
        console.print(f"no studies in {home}")
        return 0
    from autofl.search.driver_lock import DriverLock

    table = Table("study", "trials", "complete", "pruned", "failed", "interrupted", "running", "best", title=str(home))
    for name in names:
        s = st.open_study(home, name)
        try:  # issue 18: one unreadable study (storage, space, record) is shown as such, the rest listed
            rows = st.trial_rows(s)
        except (AutoFLError, OSError) as err:
            table.add_row(name, "unreadable", "-", "-", "-", "-", "-", clean(" ".join(str(err).split())[:120]))
            continue
        counts = display_counts(rows, DriverLock(s.root).is_held())
        try:
            best = st.first_value(st.best_trial(s))
        except AutoFLError:  # no completed trial yet
            best = None
        table.add_row(name, str(len(rows)), *(str(counts.get(k, 0)) for k in
                                              ("COMPLETE", "PRUNED", "FAIL", "INTERRUPTED", "RUNNING")), _fmt(best))
    console.print(table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from autofl.search import study as st

    _print_status(st.open_study(st.studies_dir(args.dir), args.name))
    return 0


def _reevaluate(study, seeds: int, top: int, vary_partition: bool, address: str | None,
                show: Console = console, verbose: bool = False) -> dict:
    """Run what is missing of the study's re-evaluation (one driver at a time) and print its table
    on `show` (stderr when stdout carries an exported config)."""
    from autofl.search.driver_lock import DriverLock
    from autofl.search.reeval import reevaluate
    from autofl.search.storage import is_sqlite
    from autofl.search.study import check_owned

    check_owned(study.root)  # the lock file and run records are written into it
    from autofl.search.preflight import check_cluster_fits, probe_address, sigterm_as_ctrl_c

    probe_address(address)  # an unreachable cluster: one line in seconds
    lock = DriverLock(study.root)
    lock.acquire(sqlite=is_sqlite(study.storage_url()))
    objective = study.space().objective

    def on_plan(missing: int, total: int) -> None:
        show.print(f"re-evaluation of study {study.name}: {total} runs (configs x seeds), "
                   f"{total - missing} already done, {missing} to run", soft_wrap=True)
        if missing:  # Ray starts only when there is something to run
            from autofl.search.ray_start import start_ray

            start_ray(study.root, address, verbose)
            sigterm_as_ctrl_c()  # after Ray's own driver handler
            resources = study.space().resources  # none of its runs could start on a cluster without them
            check_cluster_fits(resources.cpu, resources.gpu, address)

    def on_done(run, result: dict) -> None:
        show.print(f"  {run.candidate.label} seed {run.seed}: {objective}={_fmt(result.get(objective))} "
                   f"personal_test_acc={_fmt(result.get('personal_test_acc'))}", soft_wrap=True)

    try:
        summary = reevaluate(study, seeds, top, vary_partition, address, on_done=on_done, on_plan=on_plan)
    finally:
        lock.release()
    from autofl.views import reeval_table

    show.print(reeval_table(summary))
    show.print(f"verdict: {summary['verdict']}", soft_wrap=True)
    return summary


def cmd_reeval(args: argparse.Namespace) -> int:
    from autofl.search import study as st

    study = st.open_study(st.studies_dir(args.dir), args.name)
    study.space()  # validate before Ray starts
    _reevaluate(study, args.seeds, args.top, args.vary_partition, args.address, verbose=args.verbose)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autofl.report import build_report
    from autofl.search import study as st

    study = st.open_study(st.studies_dir(args.dir), args.name)
    out = Path(args.output) if args.output else study.root / "report"
    if out.exists() and not out.is_dir():
        raise AutoFLError(f"-o {out}: is a file; give a folder for report.html and its PNG figures")
    if not args.output:  # written into the study folder: only one this user owns, never through a planted link
        st.check_owned(study.root)
        if out.is_symlink():
            raise AutoFLError(f"{out}: is a symbolic link; remove it, or give -o FOLDER for the report")
    try:
        page = build_report(study, out)
    except OSError as err:
        raise AutoFLError(f"-o {out}: cannot be written ({err.strerror}); give -o a folder you may write") from None
    console.print(f"wrote {page} (self-contained, opens offline) and its figures as PNG in {out}", soft_wrap=True)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autofl.search import study as st
    from autofl.search.storage import mask_url, open_storage

    study = st.open_study(st.studies_dir(args.dir), args.name)
    try:
        import optuna_dashboard
    except ImportError:
        raise AutoFLError('dashboard: optuna-dashboard is not installed; install the extra with '
                          'pip install -e ".[dashboard]" (or pip install optuna-dashboard)') from None
    storage = open_storage(study.storage_url())
    from autofl.search.preflight import check_port

    check_port(args.port)  # a taken or impossible port is one line, before the server starts
    console.print(f"optuna-dashboard for study {study.name} ({mask_url(study.storage_url())}) on "
                  f"http://127.0.0.1:{args.port}/dashboard/ ; Ctrl-C stops it", soft_wrap=True)
    optuna_dashboard.run_server(storage, host="127.0.0.1", port=args.port)  # this machine only
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autofl.files import write_atomic
    from autofl.search import study as st
    from autofl.search.reeval import load_summary

    out = Path(args.output) if args.output else None
    if out is not None:  # checked before any work
        if out.is_dir():
            raise AutoFLError(f"-o {out}: is a folder; give a file name, e.g. {out / 'best.yaml'}")
        if out.exists() and not args.overwrite:
            raise AutoFLError(f"-o {out}: file exists; choose another name or pass --overwrite")
        if not out.parent.is_dir():
            raise AutoFLError(f"-o {out}: folder {out.parent} does not exist; create it first")
    if args.pareto and args.reeval:
        raise AutoFLError("--pareto: exports a multi-objective study's front; --reeval ranks configs on one objective")
    study = st.open_study(st.studies_dir(args.dir), args.name)
    if args.pareto:
        text = st.dump_config(st.export_pareto(study), args.format)
    else:
        st.best_trial(study)  # a study without a completed trial fails here, before any re-evaluation
        if args.reeval:
            summary = _reevaluate(study, args.reeval, args.top, args.vary_partition, args.address,
                                  show=console if out is not None else err_console, verbose=args.verbose)
        else:  # a stored re-evaluation still decides: its best by mean, not the single-seed best
            summary = load_summary(study)
        text = st.dump_config(st.export_best_config(study, summary), args.format)
    if out is not None:
        try:
            write_atomic(out, text)
        except OSError as err:
            raise AutoFLError(f"-o {out}: cannot be written ({err.strerror})") from None
        hint = "each entry's config runs with autofl train" if args.pareto else f"run it with: autofl train --config {out}"
        console.print(f"wrote {out}; {hint}", soft_wrap=True)
    else:
        sys.stdout.write(text)
    return 0


def _at_least(low: int, what: str, high: int | None = None):
    allowed = f"{low} or more" + ("" if high is None else f" and at most {high}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; allowed: {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} {what}; allowed: {allowed}")
        return value
    return parse


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the field and what is allowed) and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"autofl: error: {self.prog.removeprefix('autofl ')}: {message}\n")
        sys.exit(2)


def _reeval_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top", type=_at_least(1, "configs"), default=3,
                        help="re-evaluate the N best completed trials besides the paper default (default 3)")
    parser.add_argument("--vary-partition", action="store_true",
                        help="also redraw the client partition and split with each seed")
    _ray_options(parser)


def _ray_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show Ray's and Tune's own log lines (always kept in the study's logs/ folder)")


def cmd_list(args: argparse.Namespace) -> int:
    from autofl.listing import listing

    kinds = [args.kind] if args.kind else ["methods", "models", "datasets"]
    for kind in kinds:
        columns = ("name", "from", "about") + (("parameters: default, range",) if kind != "datasets" else ())
        table = Table(*columns, title=kind, title_justify="left")
        for row in listing([kind]):
            table.add_row(row.name, row.source, row.facts, *(("\n".join(row.params) or "-",) if kind != "datasets" else ()))
        console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="autofl", description="Hyperparameter search for personalized FL.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run one FL experiment")
    train.add_argument("--config", help="experiment YAML (default: the built-in default, digits/mlp/fedavg)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set fl.lr=0.05 (repeatable)")
    train.add_argument("--out", help="output folder (default: autofl_runs/<method>-<time>)")
    train.add_argument("--overwrite", action="store_true", help="allow writing into a folder that holds files")
    train.set_defaults(func=cmd_train)

    dir_help = "studies folder (default: $AUTOFL_HOME or ./autofl_studies)"
    search = sub.add_parser("search", help="run or resume a hyperparameter study")
    search.add_argument("--space", help="search-space YAML (new study)")
    search.add_argument("--name", help="study name (default: the space's `study`)")
    search.add_argument("--resume", metavar="NAME", help="continue an interrupted study")
    search.add_argument("--join", metavar="NAME", help="add a driver to a running study on PostgreSQL storage "
                        "(its own Tune experiment; the study's trial budget is shared)")
    search.add_argument("--trials", type=_at_least(1, "trials", 100_000), help="trials to run (new study: overrides the space; "
                        "with --resume: add this many to the study)")
    _ray_options(search)
    search.add_argument("--storage-path", help="new study: where Tune keeps experiments and checkpoints, a folder "
                        "or URI (s3://...) every Ray node reaches (default: the study folder)")
    search.add_argument("--dir", help=dir_help)
    search.set_defaults(func=cmd_search)

    studies = sub.add_parser("studies", help="list studies")
    studies.add_argument("--dir", help=dir_help)
    studies.set_defaults(func=cmd_studies)

    status = sub.add_parser("status", help="show one study's trials")
    status.add_argument("name")
    status.add_argument("--dir", help=dir_help)
    status.set_defaults(func=cmd_status)

    best = sub.add_parser("best-config", help="best configuration of a study")
    best_sub = best.add_subparsers(dest="action", required=True)
    export = best_sub.add_parser("export", help="write the best trial as a config for autofl train")
    export.add_argument("name")
    export.add_argument("-o", "--output", help="file to write (default: stdout)")
    export.add_argument("--format", choices=["yaml", "json"], default="yaml")
    export.add_argument("--overwrite", action="store_true")
    export.add_argument("--dir", help=dir_help)
    export.add_argument("--reeval", type=_at_least(2, "seeds"), metavar="K",
                        help="first re-run the best configs and the paper default over K fresh seeds (2 or more) "
                             "and export the best by mean (runs already done are reused)")
    _reeval_options(export)
    export.add_argument("--pareto", action="store_true",
                        help="multi-objective study: export its Pareto front (each trial's values and config)")
    export.set_defaults(func=cmd_export)

    report = sub.add_parser("report", help="write a study's HTML report (and its figures as PNG)")
    report.add_argument("name")
    report.add_argument("-o", "--output", help="folder for report.html and the PNGs (default: <study>/report)")
    report.add_argument("--dir", help=dir_help)
    report.set_defaults(func=cmd_report)

    dashboard = sub.add_parser("dashboard", help="serve optuna-dashboard on a study's storage at 127.0.0.1 "
                                                 "(extra: pip install -e \".[dashboard]\")")
    dashboard.add_argument("name")
    dashboard.add_argument("--port", type=_at_least(1, "as port", 65535), default=8080, help="port (default 8080)")
    dashboard.add_argument("--dir", help=dir_help)
    dashboard.set_defaults(func=cmd_dashboard)

    reeval = sub.add_parser("reeval", help="re-run a study's best configs and its paper default over fresh seeds")
    reeval.add_argument("name")
    reeval.add_argument("--seeds", type=_at_least(2, "seeds"), default=5, help="fresh seeds per config (default 5)")
    _reeval_options(reeval)
    reeval.add_argument("--dir", help=dir_help)
    reeval.set_defaults(func=cmd_reeval)

    listed = sub.add_parser("list", help="show the registered methods, models and datasets (built-in and plugins) "
                                         "with their parameters")
    listed.add_argument("kind", nargs="?", choices=["methods", "models", "datasets"], help="only this kind")
    listed.set_defaults(func=cmd_list)
    return parser


def _stdout_lost(err: OSError) -> int:
    """stdout full (ENOSPC) or closed by the reader (EPIPE): one line on stderr, exit 2, and no
    second error when Python flushes stdout at exit."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    err_console.print(f"autofl: error: cannot write the output ({err.strerror or type(err).__name__}); "
                      f"send it to a file or a reader that stays open", highlight=False, soft_wrap=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    import errno
    import os

    if sys.stdout is None:  # started with stdout closed (>&-): what would be shown is dropped
        sys.stdout = open(os.devnull, "w")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OSError as err:
        if err.errno in (errno.EPIPE, errno.ENOSPC, errno.EBADF):
            return _stdout_lost(err)
        raise
    except AutoFLError as err:
        from autofl.search.storage import mask_url

        one_line = " ".join(str(err).split())  # messages quoting YAML or driver errors can span lines
        err_console.print(f"autofl: error: {clean(mask_url(one_line))}", highlight=False, soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        err_console.print("autofl: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

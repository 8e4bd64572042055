"""The `autofl` command line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autofl.errors import AutoFLError
from autofl.files import check_output_file, write_atomic, write_failed
from autofl.limits import MAX_SEEDS, MAX_TOP
from autofl.text import clean, mask_url, terminal_console
from autofl.units import format_bytes, format_flops
from autofl.views import reeval_table, report_card_table

# what `best-config export` re-evaluates the top configs on unless --reeval says: with the default
# objective, the setting closest to the best config on the large search-benchmark tables under
# validation noise (issue 39, docs/search-quality.md)
DEFAULT_EXPORT_SEEDS = 2

# no rich markup in printed user text; 200 columns in a pipe or CI log (autofl/text.py)
console = terminal_console()
err_console = terminal_console(stderr=True)

_ROUND_COLUMNS = ("round", "train_loss", "personal_val_acc", "personal_test_acc", "global_val_acc", "global_test_acc")


# `autofl status`'s columns beside the objective, shown once some trial reported them: clients held
# out of training (validation only: status is read during a search), then the cost (reported key,
# column title, format)
_STATUS_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("unseen_val_acc", "unseen val", lambda v: _fmt(v)),
    ("upload_bytes_per_round", "upload/round", format_bytes),
    ("download_bytes_per_round", "download/round", format_bytes),
    ("flops_per_round", "FLOPs/round", format_flops),
    ("rounds_to_target", "rounds to target", lambda v: "-" if v is None else str(int(v))),
)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else clean(value)


def cmd_train(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    if args.out is not None and not args.out.strip():
        raise AutoFLError("--out: empty; give a folder, or leave --out out for autofl_runs/<method>-<time>")
    exp = api.load_config(args.config, args.set)
    out = Path(args.out) if args.out else api.default_run_dir(exp)
    console.print(
        f"autofl train: {exp.method.name} on {exp.data.dataset} ({exp.data.num_clients} clients, "
        f"{exp.data.partition.kind}), {exp.model.arch}, {exp.fl.rounds} rounds -> {out}"
    )
    table = Table(*_ROUND_COLUMNS, "seconds", title=f"{exp.method.name} / {exp.data.dataset}")
    # within a round: clients trained so far (a long round shows it is moving)
    per_round = exp.clients_per_round()
    progress = Progress(
        TextColumn("round {task.fields[rnd]}/" + str(exp.fl.rounds)),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("clients"),
        TimeElapsedColumn(),
        console=console,
    )
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
            run = api.train(
                exp, out=out, overwrite=args.overwrite, on_round=on_round, announce=announce, on_clients=on_clients
            )
    else:
        run = api.train(exp, out=out, overwrite=args.overwrite, on_round=on_round, announce=announce)
    last = run.final
    console.print(
        f"done: personal_test_acc={_fmt(last.get('personal_test_acc'))} "
        f"personal_val_acc={_fmt(last.get('personal_val_acc'))}; wrote {out}/metrics.jsonl, config.yaml, "
        f"final_state.pt",
        soft_wrap=True,
    )
    if "harmed_frac" in last:  # eval.harmed_clients
        console.print(
            f"harmed clients: harmed_frac={_fmt(last.get('harmed_frac'))} (below training alone), "
            f"harmed_vs_global={_fmt(last.get('harmed_vs_global'))} (below the FedAvg global model)",
            soft_wrap=True,
        )
    if "unseen_test_acc" in last:  # data.holdout_clients
        console.print(
            f"unseen clients ({exp.data.holdout_count()} held out, {exp.eval.newcomer_epochs} newcomer epochs): "
            f"unseen_test_acc={_fmt(last.get('unseen_test_acc'))} "
            f"participation_gap={_fmt(last.get('participation_gap'))}",
            soft_wrap=True,
        )
    target = (
        f"; rounds_to_target={_fmt(last.get('rounds_to_target'))} ({exp.eval.target_metric} >= {exp.eval.target_acc})"
        if exp.eval.target_acc is not None
        else ""
    )
    console.print(
        f"cost: upload {format_bytes(last.get('upload_bytes'))}, download {format_bytes(last.get('download_bytes'))} "
        f"({format_bytes(last.get('upload_bytes_per_round'))} / "
        f"{format_bytes(last.get('download_bytes_per_round'))} per round), "
        f"{format_flops(last.get('flops_per_round'))} per round{target}",
        soft_wrap=True,
    )
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    existing = args.resume or args.join
    # the API raises the other flag errors; in the order they were checked (resume with join, --storage-path,
    # --space), before this one
    if (
        existing
        and args.name is not None
        and not ((args.resume and args.join) or args.storage_path or args.warm_start or args.space)
    ):
        raise AutoFLError(
            f"--name: applies to a new study; --resume/--join {existing} continues the study "
            f"with its own space and name"
        )
    record_before: list[dict] = []

    def on_start(study: api.Study, logs: Path) -> None:
        console.print(
            f"autofl search: study {study.name} in {study.root}; trials' {study.trials_line()}; Ray's logs: {logs}"
            f"{' (also shown here)' if args.verbose else ''}",
            soft_wrap=True,
        )
        record_before.append(study.record)  # unchanged after a --resume that found nothing to do
        warm = study.record.get("warm_start") if args.warm_start else None
        if isinstance(warm, dict):
            console.print(str(warm.get("line", "")), soft_wrap=True)

    study = api.search(
        args.space,
        name=existing or args.name,
        trials=args.trials,
        dir=args.dir,
        address=args.address,
        resume=bool(args.resume),
        join=bool(args.join),
        storage_path=args.storage_path,
        warm_start=args.warm_start,
        verbose=args.verbose,
        on_start=on_start,
    )
    _print_status(study)
    if args.resume and not args.trials and [study.record] == record_before:
        console.print(
            f"study {study.name} has run all its trials; add more with: autofl search --resume {study.name} --trials N",
            soft_wrap=True,
        )
    if not any(r["state"] in ("COMPLETE", "PRUNED") for r in study.trials()):
        err_console.print(
            f"autofl: error: study {study.name} has no finished trial (every trial failed or none "
            f"ran); see autofl status {study.name} and {study.root / 'logs'}",
            soft_wrap=True,
        )
        return 1
    try:
        best = study.best_trial()
        console.print(
            f"best trial #{best.number}: {study.space.objective}={study.best_value():.4f} params={best.params}",
            soft_wrap=True,
        )
        if study.space.multi_objective:
            console.print(
                f"export the Pareto front with: autofl best-config export {study.name} --pareto -o front.yaml",
                soft_wrap=True,
            )
        else:
            console.print(f"export it with: autofl best-config export {study.name} -o best.yaml", soft_wrap=True)
    except AutoFLError as err:
        console.print(str(err))
    return 0


def _note(attrs: dict) -> str:
    """A trial's note in status: why it failed, that it misses the study's constraints, where it
    was warm-started from."""
    notes = [str(attrs.get("fail_reason", ""))]
    if attrs.get("feasible") is False:
        notes.append("infeasible")
    if attrs.get("warm_start_from"):
        notes.append(f"from {attrs['warm_start_from']}")
    return "; ".join(n for n in notes if n)


def _print_status(study) -> None:
    rows = study.trials()  # each row's state as shown: INTERRUPTED for what a stopped driver left
    space = study.stored_space  # a view: no experiment built, so no torch
    # unseen clients and what each trial cost, shown once some trial reported them (older studies did not)
    extra = [c for c in _STATUS_COLUMNS if any(r["user_attrs"].get(c[0]) is not None for r in rows)]
    table = Table(
        "trial",
        "state",
        "round",
        " / ".join(space.metrics),
        *(title for _, title, _ in extra),
        "node",
        "params",
        "note",
        title=f"study {study.name}",
    )
    for r in rows:
        params = ", ".join(f"{k.split(':')[-1]}={_fmt(v)}" for k, v in r["params"].items())
        state = r["state"]
        node = str(r["user_attrs"].get("node_id") or "-")[:8]
        value = " / ".join(map(_fmt, r["values"])) if space.multi_objective and r["values"] else _fmt(r["objective"])
        costs = [show(r["user_attrs"].get(key)) for key, _, show in extra]
        table.add_row(
            str(r["number"]),
            state,
            _fmt(r["round"]),
            value,
            *costs,
            node,
            params,
            _note(r["user_attrs"]),
        )
    console.print(table)
    console.print(f"storage: {study.storage_shown}", soft_wrap=True)
    warm = study.record.get("warm_start")
    if isinstance(warm, dict) and warm.get("line"):
        console.print(str(warm["line"]), soft_wrap=True)
    feasibility = study.feasibility_line(rows)
    if feasibility is not None:
        console.print(feasibility, soft_wrap=True)
    if space.multi_objective:
        front = study.pareto_rows(rows)
        goals = ", ".join(f"{m} ({d})" for m, d in zip(space.metrics, space.modes or []))
        console.print(
            f"Pareto front of {goals}: "
            + ("; ".join(f"trial {r['number']} ({' / '.join(map(_fmt, r['values']))})" for r in front) or "none yet"),
            soft_wrap=True,
        )
    if space.budget_rounds is not None:
        used = sum(r["round"] or 0 for r in rows)  # each trial's last reported round, as the budget counts
        console.print(f"budget: {used} of {space.budget_rounds} FL rounds used (budget_rounds)")
    if space.time_budget_s is not None:
        walls = [run.get("tune_wall_s", 0.0) for run in study.runs]
        console.print(
            f"budget: runs took {', '.join(f'{w:.0f} s' for w in walls) or 'none'} of "
            f"{space.time_budget_s:.0f} s each (time_budget_s)"
        )
    counts = Counter(r["state"] for r in rows)
    console.print("trials: " + (", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())) or "none"))
    summary = study.reeval_summary()
    if summary is not None:
        console.print(reeval_table(summary))
        console.print(f"verdict: {summary['verdict']}", soft_wrap=True)
        console.print(report_card_table(summary))


def cmd_studies(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    home = api.studies_dir(args.dir)
    names = api.list_studies(home)
    skipped = api.skipped_study_folders(home)
    if skipped:  # one line; the valid studies are still listed
        err_console.print(
            f"autofl: skipped {len(skipped)} folder{'s' if len(skipped) > 1 else ''} in {home} whose "
            f"name is not a study name: {', '.join(clean(repr(n)) for n in skipped)}; rename "
            f"{'them' if len(skipped) > 1 else 'it'} ({api.study_name_rule()}) to use "
            f"{'them' if len(skipped) > 1 else 'it'}",
            highlight=False,
            soft_wrap=True,
        )
    if not names:
        console.print(f"no studies in {home}")
        return 0
    table = Table("study", "trials", "complete", "pruned", "failed", "interrupted", "running", "best", title=str(home))
    for name in names:
        s = api.load_study(name, home)
        try:  # issue 18: one unreadable study (storage, space, record) is shown as such, the rest listed
            rows = s.trials()
        except (AutoFLError, OSError) as err:
            table.add_row(name, "unreadable", "-", "-", "-", "-", "-", clean(" ".join(str(err).split())[:120]))
            continue
        counts = Counter(r["state"] for r in rows)
        best = s.best_objective(rows)
        table.add_row(
            name,
            str(len(rows)),
            *(str(counts.get(k, 0)) for k in ("COMPLETE", "PRUNED", "FAIL", "INTERRUPTED", "RUNNING")),
            _fmt(best),
        )
    console.print(table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    _print_status(api.load_study(args.name, args.dir))
    return 0


def _reevaluate(
    study,
    seeds: int,
    top: int,
    vary_partition: bool,
    address: str | None,
    show: Console = console,
    verbose: bool = False,
) -> dict:
    """Run what is missing of the study's re-evaluation (one driver at a time) and print its table
    on `show` (stderr when stdout carries an exported config)."""
    objective = study.space.objective

    def on_plan(missing: int, total: int) -> None:
        show.print(
            f"re-evaluation of study {study.name}: {total} runs (configs x seeds), "
            f"{total - missing} already done, {missing} to run",
            soft_wrap=True,
        )

    def on_done(run, result: dict) -> None:
        show.print(
            f"  {run.candidate.label} seed {run.seed}: {objective}={_fmt(result.get(objective))} "
            f"personal_test_acc={_fmt(result.get('personal_test_acc'))}",
            soft_wrap=True,
        )

    summary = study.reevaluate(
        seeds, top, vary_partition=vary_partition, address=address, verbose=verbose, on_plan=on_plan, on_done=on_done
    )

    show.print(reeval_table(summary))
    show.print(f"verdict: {summary['verdict']}", soft_wrap=True)
    show.print(report_card_table(summary))
    return summary


def cmd_reeval(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    study = api.load_study(args.name, args.dir)
    _reevaluate(study, args.seeds, args.top, args.vary_partition, args.address, verbose=args.verbose)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    study = api.load_study(args.name, args.dir)
    page = study.report(args.output)
    out = page.parent
    console.print(f"wrote {page} (self-contained, opens offline) and its figures as PNG in {out}", soft_wrap=True)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    study = api.load_study(args.name, args.dir)
    study.serve_dashboard(args.port, on_ready=lambda line: console.print(line, soft_wrap=True))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    out = Path(args.output) if args.output else None
    if out is not None:  # checked before any work
        if out.is_dir() and not out.is_symlink():
            raise AutoFLError(f"-o {out}: is a folder; give a file name, e.g. {out / 'best.yaml'}")
        check_output_file(out, "-o")  # never over a link, FIFO or device, --overwrite or not
        if out.exists() and not args.overwrite:
            raise AutoFLError(f"-o {out}: file exists; choose another name or pass --overwrite")
        if not out.parent.is_dir():
            raise AutoFLError(f"-o {out}: folder {out.parent} does not exist; create it first")
    if args.pareto and args.reeval:
        raise AutoFLError("--pareto: exports a multi-objective study's front; --reeval ranks configs on one objective")
    study = api.load_study(args.name, args.dir)
    if args.pareto:
        text = api.config_text(study.pareto_front(), args.format)
    else:
        study.best_row()  # a study without a completed trial fails here, before any re-evaluation
        seeds = args.reeval
        if seeds is None:  # not given: re-evaluate a study of one objective on the default seeds
            seeds = 0 if study.stored_space.multi_objective else DEFAULT_EXPORT_SEEDS
        summary = None  # a stored re-evaluation still decides: its best by mean, not the single-seed best
        if seeds:
            summary = _reevaluate(
                study,
                seeds,
                args.top,
                args.vary_partition,
                args.address,
                show=console if out is not None else err_console,
                verbose=args.verbose,
            )
        text = api.config_text(study.best_config(summary), args.format)
    if out is not None:
        try:
            write_atomic(out, text)
        except OSError as err:
            raise AutoFLError(f"-o {out}: cannot be written ({err.strerror})") from None
        hint = (
            "each entry's config runs with autofl train" if args.pareto else f"run it with: autofl train --config {out}"
        )
        console.print(f"wrote {out}; {hint}", soft_wrap=True)
    else:
        sys.stdout.write(text)
    return 0


def _at_least(low: int, what: str, high: int | None = None, off: str | None = None):
    """An argparse type: a whole number from `low` (to `high`); with `off`, 0 too, which it names."""
    allowed = f"{low} or more" + ("" if high is None else f" and at most {high}")
    if off is not None:
        allowed = f"0 ({off}), or {allowed}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; allowed: {allowed}") from None
        if not (off is not None and value == 0) and (value < low or (high is not None and value > high)):
            raise argparse.ArgumentTypeError(f"{value} {what}; allowed: {allowed}")
        return value

    return parse


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the field and what is allowed) and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"autofl: error: {self.prog.removeprefix('autofl ')}: {message}\n")
        sys.exit(2)


def _reeval_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--top",
        type=_at_least(1, "configs", MAX_TOP),
        default=3,
        help="re-evaluate the N best completed trials besides the paper default (default 3)",
    )
    parser.add_argument(
        "--vary-partition", action="store_true", help="also redraw the client partition and split with each seed"
    )
    _ray_options(parser)


def _ray_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show Ray's and Tune's own log lines (always kept in the study's logs/ folder)",
    )


_SLURM_FLAGS = (
    "nodes",
    "cpus_per_node",
    "gpus_per_node",
    "time",
    "signal_before_s",
    "partition",
    "account",
    "qos",
    "mem",
    "job_name",
    "sbatch",
    "setup",
    "python",
)


def cmd_slurm(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    if args.resume and args.name is not None:
        raise AutoFLError(
            f"--name: applies to a new study; --resume {args.resume} continues the study with its own name"
        )
    given = {k: getattr(args, k) for k in _SLURM_FLAGS if getattr(args, k) not in (None, [])}
    options = api.slurm_options(given, flags=True)
    job = api.submit_slurm(
        args.space,
        name=args.resume or args.name,
        resume=bool(args.resume),
        trials=args.trials,
        dir=args.dir,
        options=options,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        sys.stdout.write(job.script)
        return 0
    console.print(
        f"autofl slurm: submitted job {job.job_id} for study {job.study} ({job.script_path}); its output: "
        f"{job.script_path.parent}/slurm-{job.job_id}.out; follow it with: autofl status {job.study}",
        soft_wrap=True,
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

    kinds = [args.kind] if args.kind else ["methods", "models", "datasets"]
    rows = api.list_entries(kinds)
    for kind in kinds:
        columns = ("name", "from", "about") + (("parameters: default, range",) if kind != "datasets" else ())
        table = Table(*columns, title=kind, title_justify="left")
        for row in (r for r in rows if r.kind == kind):
            table.add_row(
                row.name, row.source, row.facts, *(("\n".join(row.params) or "-",) if kind != "datasets" else ())
            )
        console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="autofl", description="Hyperparameter search for personalized FL.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run one FL experiment")
    train.add_argument("--config", help="experiment YAML (default: the built-in default, digits/mlp/fedavg)")
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set fl.lr=0.05 (repeatable)",
    )
    train.add_argument("--out", help="output folder (default: autofl_runs/<method>-<time>)")
    train.add_argument("--overwrite", action="store_true", help="allow writing into a folder that holds files")
    train.set_defaults(func=cmd_train)

    dir_help = "studies folder (default: $AUTOFL_HOME or ./autofl_studies)"
    search = sub.add_parser("search", help="run or resume a hyperparameter study")
    search.add_argument("--space", help="search-space YAML (new study)")
    search.add_argument("--name", help="study name (default: the space's `study`)")
    search.add_argument("--resume", metavar="NAME", help="continue an interrupted study")
    search.add_argument(
        "--join",
        metavar="NAME",
        help="add a driver to a running study on PostgreSQL or journal "
        "storage (its own Tune experiment; the study's trial budget is shared)",
    )
    search.add_argument(
        "--trials",
        type=_at_least(1, "trials", 100_000),
        help="trials to run (new study: overrides the space; with --resume: add this many to the study)",
    )
    _ray_options(search)
    search.add_argument(
        "--storage-path",
        help="new study: where Tune keeps experiments and checkpoints, a folder "
        "or URI (s3://...) every Ray node reaches (default: the study folder)",
    )
    search.add_argument(
        "--warm-start",
        metavar="OTHER",
        help="new study: begin with the finished trials of study OTHER (same --dir) that fit the "
        "space; they train nothing and count against no budget",
    )
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
    export.add_argument(
        "--reeval",
        type=_at_least(2, "seeds", MAX_SEEDS, off="no re-evaluation"),
        metavar="K",
        help=f"first re-run the --top best configs and the paper default over K fresh seeds (2-{MAX_SEEDS}; "
        f"default {DEFAULT_EXPORT_SEEDS}, none for a multi-objective study) and export the best by mean: one "
        "seed's validation winner can be points off on test (runs already done are reused); 0: export the "
        "single-seed best without training",
    )
    _reeval_options(export)
    export.add_argument(
        "--pareto",
        action="store_true",
        help="multi-objective study: export its Pareto front (each trial's values and config)",
    )
    export.set_defaults(func=cmd_export)

    report = sub.add_parser("report", help="write a study's HTML report (and its figures as PNG)")
    report.add_argument("name")
    report.add_argument("-o", "--output", help="folder for report.html and the PNGs (default: <study>/report)")
    report.add_argument("--dir", help=dir_help)
    report.set_defaults(func=cmd_report)

    dashboard = sub.add_parser(
        "dashboard",
        help='serve optuna-dashboard on a study\'s storage at 127.0.0.1 (extra: pip install -e ".[dashboard]")',
    )
    dashboard.add_argument("name")
    dashboard.add_argument("--port", type=_at_least(1, "as port", 65535), default=8080, help="port (default 8080)")
    dashboard.add_argument("--dir", help=dir_help)
    dashboard.set_defaults(func=cmd_dashboard)

    reeval = sub.add_parser("reeval", help="re-run a study's best configs and its paper default over fresh seeds")
    reeval.add_argument("name")
    reeval.add_argument(
        "--seeds",
        type=_at_least(2, "seeds", MAX_SEEDS),
        default=5,
        help=f"fresh seeds per config (default 5, at most {MAX_SEEDS})",
    )
    _reeval_options(reeval)
    reeval.add_argument("--dir", help=dir_help)
    reeval.set_defaults(func=cmd_reeval)

    slurm = sub.add_parser(
        "slurm",
        help="run a study as a SLURM batch job: Ray on the job's nodes, the study on a "
        "journal in its folder, requeued to resume at the time limit",
    )
    slurm.add_argument("--space", help="search-space YAML (new study: created now)")
    slurm.add_argument("--name", help="study name (default: the space's `study`)")
    slurm.add_argument("--resume", metavar="NAME", help="submit a job that continues an existing study")
    slurm.add_argument("--trials", type=_at_least(1, "trials", 100_000), help="new study: trials (overrides the space)")
    slurm.add_argument("--dir", help=dir_help + "; on a filesystem every node reaches")
    slurm.add_argument(
        "--nodes", type=_at_least(1, "nodes"), help="nodes (default 1): a Ray head on the first, a worker on each other"
    )
    slurm.add_argument(
        "--cpus-per-node", dest="cpus_per_node", type=_at_least(1, "CPUs"), help="CPUs per node for Ray (default 4)"
    )
    slurm.add_argument(
        "--gpus-per-node",
        dest="gpus_per_node",
        type=_at_least(0, "GPUs"),
        help="GPUs per node for Ray (default 0); a trial takes the space's resources.gpu",
    )
    slurm.add_argument("--time", help="time limit, e.g. 04:00:00 or 1-00:00:00 (default 01:00:00)")
    slurm.add_argument(
        "--signal-before",
        dest="signal_before_s",
        type=_at_least(30, "seconds"),
        metavar="SECONDS",
        help="SLURM sends USR1 this long before the time limit: the study is saved and the job requeued (default 300)",
    )
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--qos")
    slurm.add_argument("--mem", help="memory per node, e.g. 64G")
    slurm.add_argument("--job-name", dest="job_name", help="default: autofl-<study>")
    slurm.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="another sbatch option, e.g. --sbatch=--constraint=a100 (repeatable)",
    )
    slurm.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="a shell line run first in the job, e.g. --setup 'module load cuda' (repeatable)",
    )
    slurm.add_argument("--python", help="the Python with autofl installed, as the nodes see it (default: this one)")
    slurm.add_argument("--dry-run", action="store_true", help="print the batch script; create and submit nothing")
    slurm.set_defaults(func=cmd_slurm)

    listed = sub.add_parser(
        "list", help="show the registered methods, models and datasets (built-in and plugins) with their parameters"
    )
    listed.add_argument("kind", nargs="?", choices=["methods", "models", "datasets"], help="only this kind")
    listed.set_defaults(func=cmd_list)
    return parser


def _stdout_lost(err: OSError) -> int:
    """stdout full (ENOSPC) or closed by the reader (EPIPE): one line on stderr, exit 2, and no
    second error when Python flushes stdout at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    err_console.print(
        f"autofl: error: cannot write the output ({err.strerror or type(err).__name__}); "
        f"send it to a file or a reader that stays open",
        highlight=False,
        soft_wrap=True,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    if sys.stdout is None:  # started with stdout closed (>&-): what would be shown is dropped
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stdout for the rest of the process
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    finally:
        from autofl import api  # lazy: --help and argument errors start without the API's imports (0.1-0.2 s)

        api.release_sigterm()  # the work is done: Ray's atexit shutdown is all that is left


def _dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command; the errors a user can act on become one line and an exit code."""
    try:
        return int(args.func(args) or 0)
    except OSError as err:
        if err.filename is not None and err.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):  # a named file
            err_console.print(
                f"autofl: error: {clean(str(write_failed(err.filename, err)))}", highlight=False, soft_wrap=True
            )
            return 2
        if err.errno in (errno.EPIPE, errno.ENOSPC, errno.EBADF):
            return _stdout_lost(err)
        raise
    except AutoFLError as err:
        one_line = " ".join(str(err).split())  # messages quoting YAML or driver errors can span lines
        err_console.print(f"autofl: error: {clean(mask_url(one_line))}", highlight=False, soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        err_console.print("autofl: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

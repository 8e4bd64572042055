"""The `autofl` command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from autofl.errors import AutoFLError

console = Console()
err_console = Console(stderr=True)

_ROUND_COLUMNS = ("round", "train_loss", "personal_val_acc", "personal_test_acc", "global_val_acc", "global_test_acc")


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)


def cmd_train(args: argparse.Namespace) -> int:
    from autofl.config import load_experiment
    from autofl.train import run_training

    exp = load_experiment(args.config, args.set)
    out = Path(args.out) if args.out else Path("autofl_runs") / f"{exp.method.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"[bold]autofl train[/]: {exp.method.name} on {exp.data.dataset} ({exp.data.num_clients} clients, "
                  f"{exp.data.partition.kind}), {exp.model.arch}, {exp.fl.rounds} rounds -> {out}")
    table = Table(*_ROUND_COLUMNS, "seconds", title=f"{exp.method.name} / {exp.data.dataset}")
    live = Live(table, console=console, refresh_per_second=4) if console.is_terminal else None

    def on_round(metrics: dict[str, float], seconds: float) -> None:
        row = [_fmt(metrics.get(k)) for k in _ROUND_COLUMNS] + [f"{seconds:.1f}"]
        if live is not None:
            table.add_row(*row)
        else:
            console.print("  ".join(f"{k}={v}" for k, v in zip((*_ROUND_COLUMNS, "seconds"), row)), soft_wrap=True)

    if live is not None:
        with live:
            history = run_training(exp, out, on_round, args.overwrite)
    else:
        history = run_training(exp, out, on_round, args.overwrite)
    last = history[-1]
    console.print(f"done: personal_test_acc={last['personal_test_acc']:.4f} "
                  f"personal_val_acc={last['personal_val_acc']:.4f}; wrote {out}/metrics.jsonl, config.yaml, "
                  f"final_state.pt", soft_wrap=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autofl", description="Hyperparameter search for personalized FL.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run one FL experiment")
    train.add_argument("--config", help="experiment YAML (default: the built-in default, digits/mlp/fedavg)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set fl.lr=0.05 (repeatable)")
    train.add_argument("--out", help="output folder (default: autofl_runs/<method>-<time>)")
    train.add_argument("--overwrite", action="store_true", help="allow writing into a folder that holds files")
    train.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AutoFLError as err:
        err_console.print(f"autofl: error: {err}", highlight=False, soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        err_console.print("autofl: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

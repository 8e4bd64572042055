"""Rich tables shared by the commands that show a study's results."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from autofl.text import clean
from autofl.units import format_bytes, format_flops


def format_interval(stat: dict[str, float] | None, signed: bool = False, bounds: bool = False) -> str:
    """A mean with its 95% CI (Student t): `mean ± h` (the CI is [mean - h, mean + h]), or with
    `bounds` `mean [low, high]`; the mean alone for one seed, `-` for none. The one format of an
    interval: terminal tables and the HTML report."""
    if not stat:
        return "-"
    text = f"{stat['mean']:+.4f}" if signed else f"{stat['mean']:.4f}"
    if math.isnan(stat.get("ci_low", math.nan)) or math.isnan(stat.get("ci_high", math.nan)):
        return text
    if bounds:
        return f"{text} [{stat['ci_low']:.4f}, {stat['ci_high']:.4f}]"
    return f"{text} ± {stat['ci_high'] - stat['mean']:.4f}"


_interval = format_interval


def format_params(params: dict[str, Any], short: bool = True) -> str:
    """Searched values, floats to 4 significant digits; `short`: each key by its last part
    (`fdcl:method.mu` -> mu)."""
    name = (lambda k: k.split(":")[-1].split(".")[-1]) if short else (lambda k: k)

    return clean(  # user values reach the terminal: control characters escaped
        ", ".join(f"{name(k)}={v:.4g}" if isinstance(v, float) else f"{name(k)}={v}" for k, v in params.items())
    )


def reeval_table(summary: dict[str, Any]) -> Table:
    objective = summary["objective"]
    seeds = summary["seeds"]
    partition = "partition redrawn per seed" if summary["vary_partition"] else "the study's partition"
    title = (
        f"re-evaluation over {len(seeds)} fresh seeds ({seeds[0]}..{seeds[-1]}, {partition}): "
        f"mean ± 95% CI half-width; Δ = paired difference to the paper default"
    )
    table = Table(
        "config",
        "search",
        objective,
        "personal_test_acc",
        f"Δ {objective}",
        "Δ personal_test_acc",
        "seeds",
        "params",
        title=title,
    )
    for row in summary["rows"]:
        name = row["candidate"] + (" (best)" if row["candidate"] == summary["best"] else "")
        search = "-" if row.get("search_value") is None else f"{row['search_value']:.4f}"
        table.add_row(
            name,
            search,
            _interval(row.get(objective)),
            _interval(row.get("personal_test_acc")),
            _interval(row.get(f"diff_{objective}"), signed=True),
            _interval(row.get("diff_personal_test_acc"), signed=True),
            str(len(row["seeds"])),
            format_params(row["params"]) or "(paper default)",
        )
    return table


# the report card (issue 40): per re-evaluated config, mean and 95% CI over seeds of what a pFL
# reviewer reads, a column where some config reported it: (metric, title, format of the mean)
CARD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("personal_test_acc", "test acc (sample-weighted)"),
    ("personal_test_acc_unweighted", "test acc (client mean)"),
    ("personal_test_acc_std", "std over clients"),
    ("personal_test_acc_p10", "p10 client"),
    ("unseen_test_acc", "unseen clients"),
    ("participation_gap", "participation gap"),
    ("harmed_frac", "harmed (vs local)"),
    ("harmed_vs_global", "harmed (vs FedAvg)"),
    ("upload_bytes_per_round", "upload/round"),
    ("download_bytes_per_round", "download/round"),
    ("flops_per_round", "FLOPs/round"),
)


def report_card(summary: dict[str, Any], bounds: bool = False) -> tuple[list[str], list[list[str]]]:
    """The report card's header and rows (text): config, then each CARD_COLUMNS metric some config
    has, as `mean ± h` (or `mean [low, high]` with `bounds`); bytes and FLOPs as their mean."""
    rows = summary["rows"]
    columns = [(k, title) for k, title in CARD_COLUMNS if any(k in r for r in rows)]

    def cell(key: str, stat: dict[str, float] | None) -> str:
        if stat is None:
            return "-"
        if key.endswith("bytes_per_round"):
            return format_bytes(stat["mean"])
        if key == "flops_per_round":
            return format_flops(stat["mean"])
        return format_interval(stat, signed=key == "participation_gap", bounds=bounds)

    body = [
        [r["candidate"] + (" (best)" if r["candidate"] == summary["best"] else "")]
        + [cell(k, r.get(k)) for k, _ in columns]
        for r in rows
    ]
    return ["config", *(title for _, title in columns)], body


def report_card_table(summary: dict[str, Any]) -> Table:
    header, body = report_card(summary)
    table = Table(*header, title=f"report card: mean ± 95% CI over {len(summary['seeds'])} seeds, test splits")
    for row in body:
        table.add_row(*row)
    return table

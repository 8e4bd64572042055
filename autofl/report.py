"""`autofl report`: one self-contained HTML page per study (it opens offline: figures are embedded
PNGs, no script), plus the same figures as PNG files.

Figures: best-so-far objective against trials and against compute (FL rounds x clients trained),
every trial's round curve with ASHA's rungs marked and pruned trials distinguished, parameter
importances (Optuna's fANOVA evaluator), one slice plot per parameter, a parallel-coordinates plot,
the re-evaluation's confidence intervals, and for cross-method studies a leaderboard. The Optuna
figures come from `optuna.visualization.matplotlib`; the others are plain matplotlib.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autofl.errors import AutoFLError
from autofl.experiment import build_experiment
from autofl.files import write_atomic
from autofl.tuning.reeval import load_summary
from autofl.tuning.store.ledger import is_warm_started
from autofl.tuning.store.study import StudyFolder, best_of_rows, pareto_trials, rows_of
from autofl.tuning.strategy.constraints import feasibility_line, is_feasible
from autofl.tuning.strategy.objectives import better, sign
from autofl.units import format_bytes, format_flops
from autofl.views import format_interval, format_params, report_card


@dataclass
class Figure:
    name: str  # file stem
    title: str
    png: bytes | None  # None: could not be drawn, `note` says why
    note: str = ""


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _figure(name: str, title: str, draw: Callable[[], Any]) -> Figure:
    """Draw with `draw` (returns a matplotlib Axes, array of Axes or Figure); a figure that cannot
    be drawn for this study (e.g. importances from one completed trial) becomes a note."""
    import matplotlib.pyplot as plt

    # user text (parameter values, method names) may hold `$...$`: plain text, never mathtext
    with plt.rc_context({"text.parse_math": False}):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                out = draw()
        except (ValueError, RuntimeError, ZeroDivisionError, IndexError) as err:
            plt.close("all")
            return Figure(name, title, None, f"not drawn: {err}")
        fig = out if hasattr(out, "savefig") else (out.flat[0] if hasattr(out, "flat") else out).get_figure()
        readable(fig)
        return Figure(name, title, _png(fig))


# where a colour map is lighter than this (mean of R, G, B), a point or line on white is hard to see
NEAR_WHITE = 0.85
VISIBLE_FROM = 0.3  # the share of a sequential map cut off at its white end ("Blues" starts at #f7fbff)


def readable(fig) -> None:
    """Make Optuna's matplotlib figures readable as autofl draws them (text.parse_math off, so that
    user text stays text): a log axis gets plain tick labels (`0.01`, `1e-05`) instead of mathtext
    (`$\\mathdefault{10^{-2}}$`, shown raw and overlapping), and a colour map that starts or ends
    at white (Optuna's "Blues") starts at a visible blue, so that no trial is drawn white on white."""
    from matplotlib.ticker import LogFormatter

    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                major, minor = axis.get_major_formatter(), axis.get_minor_formatter()
                axis.set_major_formatter(LogFormatter(labelOnlyBase=getattr(major, "labelOnlyBase", True)))
                axis.set_minor_formatter(
                    LogFormatter(
                        labelOnlyBase=getattr(minor, "labelOnlyBase", False),
                        minor_thresholds=getattr(minor, "minor_thresholds", None),
                    )
                )
        for mappable in ax.collections:
            cmap = mappable.get_cmap() if hasattr(mappable, "get_cmap") else None
            if cmap is not None and mappable.get_array() is not None:
                mappable.set_cmap(visible_cmap(cmap))  # its colour bar follows


def visible_cmap(cmap):
    """`cmap` without its near-white end (unchanged if neither end is near white)."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    def light(x: float) -> bool:
        return float(np.mean(cmap(x)[:3])) > NEAR_WHITE

    if light(0.0) and not light(1.0):
        return ListedColormap(cmap(np.linspace(VISIBLE_FROM, 1.0, 256)), name=f"{cmap.name}_visible")
    if light(1.0) and not light(0.0):
        return ListedColormap(cmap(np.linspace(0.0, 1.0 - VISIBLE_FROM, 256)), name=f"{cmap.name}_visible")
    return cmap


def trial_compute(space, trials: list) -> dict[int, float]:
    """Clients trained by each finished trial: rounds it reached x sampled clients per round (0 for
    a trial warm-started from another study: it trained there)."""
    out = {}
    for t in trials:
        if t.state.is_finished():
            exp = build_experiment(space.config(t.params))
            rounds = 0 if is_warm_started(t) else max(t.intermediate_values, default=0)
            out[t.number] = rounds * exp.clients_per_round()
    return out


def asha_milestones(space) -> list[int]:
    """The rounds at which ASHA compares trials: grace_period * reduction_factor^k below max rounds
    (hyperband: those of its first bracket)."""
    if space.scheduler.kind not in ("asha", "hyperband"):
        return []
    from autofl.tuning.strategy.asha import milestones  # lazy: pulls numpy

    return [
        int(m)
        for m in milestones(space.scheduler.grace_period, space.max_rounds, space.scheduler.reduction_factor)
        if m < space.max_rounds
    ]


def _best_so_far(space, ot, trials: list, compute: dict[int, float]) -> list[Figure]:
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ovm

    xs, ys, best, spent = [], [], None, 0.0
    for t in sorted(trials, key=lambda t: t.datetime_complete or t.datetime_start):
        if not t.state.is_finished():
            continue
        spent += compute[t.number]
        if t.state.name == "COMPLETE" and t.values and is_feasible(t):  # never an infeasible best
            best = t.values[0] if better(t.values[0], best, space.mode) else best
        if best is not None:
            xs.append(spent)
            ys.append(best)

    def compute_plot():
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.step(xs, ys, where="post", color="tab:blue")
        ax.set_xlabel("compute spent: FL rounds x clients trained, all trials")
        ax.set_ylabel(f"best {space.objective} so far")
        ax.set_title("Best so far vs compute")
        ax.grid(alpha=0.3)
        return fig

    return [
        _figure(
            "best_vs_trial",
            "Best so far vs trial (Optuna optimization history)",
            lambda: ovm.plot_optimization_history(ot, target=_target(space), target_name=space.objective),
        ),
        _figure("best_vs_compute", "Best so far vs compute", compute_plot),
    ]


def _round_curves(space, trials: list) -> Figure:
    import matplotlib.pyplot as plt

    def draw():
        fig, ax = plt.subplots(figsize=(8, 4.5))
        styles: dict[str, dict[str, Any]] = {
            "COMPLETE": dict(color="tab:blue", alpha=0.8, lw=1.4),
            "PRUNED": dict(color="tab:gray", alpha=0.6, lw=1.0, ls="--"),
            "FAIL": dict(color="tab:red", alpha=0.6, lw=1.0, ls=":"),
        }
        labelled = set()
        for t in trials:
            if not t.intermediate_values or t.state.name not in styles:
                continue
            steps = sorted(t.intermediate_values)
            label = None if t.state.name in labelled else t.state.name.lower()
            labelled.add(t.state.name)
            ax.plot(steps, [t.intermediate_values[s] for s in steps], marker=".", label=label, **styles[t.state.name])
        for i, rung in enumerate(asha_milestones(space)):
            ax.axvline(rung, color="tab:orange", lw=1, alpha=0.7, label="ASHA rung" if i == 0 else None)
        ax.set_xlabel("FL round")
        ax.set_ylabel(space.objective)
        ax.set_title("Every trial's round curve (dashed: pruned by ASHA)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        return fig

    return _figure("round_curves", "Round curves, ASHA rungs and pruned trials", draw)


def _optuna_figures(space, ot, trials: list) -> list[Figure]:
    import optuna
    import optuna.visualization.matplotlib as ovm

    names = sorted({p for t in trials if t.state.name == "COMPLETE" for p in t.params})
    target = _target(space)
    figures = []
    if space.multi_objective and len(space.metrics) <= 3:
        figures.append(
            _figure("pareto_front", "Pareto front", lambda: ovm.plot_pareto_front(ot, target_names=space.metrics))
        )
    figures.append(
        _figure(
            "importances",
            "Parameter importances (fANOVA)",
            lambda: ovm.plot_param_importances(
                ot,
                evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                target=target,
                target_name=space.objective,
            ),
        )
    )
    for name in names:
        stem = "slice_" + "".join(c if c.isalnum() else "_" for c in name)
        figures.append(
            _figure(
                stem,
                f"Slice: {name}",
                functools.partial(ovm.plot_slice, ot, params=[name], target=target, target_name=space.objective),
            )
        )
    figures.append(
        _figure(
            "parallel_coordinates",
            "Parallel coordinates",
            lambda: ovm.plot_parallel_coordinate(ot, target=target, target_name=space.objective),
        )
    )
    return figures


def _target(space) -> Callable[[Any], float] | None:
    """Optuna's plots take one value per trial: a multi-objective study's first objective."""
    return (lambda t: t.values[0]) if space.multi_objective else None


def _reeval_figure(summary: dict[str, Any]) -> Figure:
    import matplotlib.pyplot as plt

    objective = summary["objective"]

    def draw():
        rows = [r for r in summary["rows"] if objective in r]
        fig, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.5))
        for i, metric in enumerate((objective, "personal_test_acc")):
            ys = [j + (0.15 if i else -0.15) for j in range(len(rows))]
            stats = [r.get(metric, {}) for r in rows]
            means = [s.get("mean", math.nan) for s in stats]
            halves = [0.0 if math.isnan(s.get("ci_high", math.nan)) else s["ci_high"] - s["mean"] for s in stats]
            ax.errorbar(means, ys, xerr=halves, fmt="o", capsize=4, label=f"{metric} (95% CI)")
        ax.set_yticks(range(len(rows)), [r["candidate"] for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel("accuracy, mean over fresh seeds")
        ax.set_title("Re-evaluation")
        ax.grid(alpha=0.3, axis="x")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8)
        return fig

    return _figure("reeval", "Re-evaluation: mean and 95% CI per config", draw)


def leaderboard(space, trials: list, compute: dict[int, float], summary: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Cross-method studies: per method, its best trial, re-evaluated mean (if one of its configs
    was re-evaluated), trials run and compute spent."""
    methods: dict[str, dict[str, Any]] = {}
    for t in trials:
        if "method.name" not in t.params or not t.state.is_finished():
            continue
        row = methods.setdefault(
            t.params["method.name"],
            {
                "method": t.params["method.name"],
                "best": None,
                "best_trial": None,
                "trials": 0,
                "compute": 0.0,
                "reeval_mean": None,
            },
        )
        row["trials"] += 1
        row["compute"] += compute[t.number]
        value = t.values[0] if t.values else None
        if (
            t.state.name == "COMPLETE"
            and value is not None
            and is_feasible(t)
            and (row["best"] is None or not better(row["best"], value, space.mode))
        ):  # ties: the later trial
            row["best"], row["best_trial"] = value, t.number
    for r in (summary or {}).get("rows", []):
        method = r["params"].get("method.name")
        if method in methods and space.objective in r:
            current = methods[method]["reeval_mean"]
            mean = r[space.objective]["mean"]
            methods[method]["reeval_mean"] = mean if better(mean, current, space.mode) else current
    return sorted(methods.values(), key=lambda r: (r["best"] is None, -sign(space.mode) * (r["best"] or 0)))


COST_TABLE_ROWS = 50  # the cost table's trials, best first


def cost_table(space, trials: list) -> tuple[list[str], list[list[Any]]]:
    """The report's cost table: per finished trial that reported its cost (autofl.engine.cost), best
    first, its objective value, bytes up and down (per round, and in all), training FLOPs per round
    and rounds to target. No rows for a study whose trials reported no cost (older studies)."""
    header = [
        "trial",
        space.objective,
        "upload/round",
        "download/round",
        "upload total",
        "download total",
        "FLOPs/round",
        "rounds to target",
    ]
    costed = [
        t
        for t in trials
        if t.state.name in ("COMPLETE", "PRUNED") and t.user_attrs.get("upload_bytes_per_round") is not None
    ]

    def value(t: Any) -> float:
        if t.values:
            return t.values[0]
        steps = t.intermediate_values
        return steps[max(steps)] if steps else -sign(space.mode) * math.inf

    rows = []
    for t in sorted(costed, key=lambda t: -sign(space.mode) * value(t))[:COST_TABLE_ROWS]:
        a = t.user_attrs
        rows.append(
            [
                t.number,
                value(t),
                format_bytes(a.get("upload_bytes_per_round")),
                format_bytes(a.get("download_bytes_per_round")),
                format_bytes(a.get("upload_bytes")),
                format_bytes(a.get("download_bytes")),
                format_flops(a.get("flops_per_round")),
                a.get("rounds_to_target"),
            ]
        )
    return header, rows


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4f}" if math.isfinite(v) else "-"
        return html.escape("-" if v is None else str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _interval(stat: dict[str, float] | None) -> str:
    return format_interval(stat, bounds=True)


WIDE = ("round_curves", "parallel_coordinates")  # figures given the page's full width
CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}.figures{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0;flex:1 1 480px;max-width:540px}
figure.wide{flex-basis:100%;max-width:100%}figcaption{font-weight:600;margin-bottom:.3em}
img{max-width:100%;border:1px solid #eee}.note{color:#a00}.verdict{font-weight:600}"""


def build_report(study: StudyFolder, out_dir: Path) -> Path:
    """Write `<out_dir>/report.html` and one PNG per figure; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")

    space = study.space()
    ot = study.load_optuna()
    trials = ot.get_trials(deepcopy=False) if ot is not None else []
    if not any(t.state.name == "COMPLETE" for t in trials):
        raise AutoFLError(
            f"study {study.name!r} has no completed trial yet; nothing to report (see autofl status {study.name})"
        )
    summary = load_summary(study)
    compute = trial_compute(space, trials)
    figures = [
        *_best_so_far(space, ot, trials, compute),
        _round_curves(space, trials),
        *_optuna_figures(space, ot, trials),
    ]
    if summary is not None:
        figures.append(_reeval_figure(summary))
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in figures:
        if f.png is not None:
            write_atomic(out_dir / f"{f.name}.png", f.png)  # never through a link planted there

    counts = Counter(t.state.name for t in trials)
    parts = [
        f"<h1>autofl study {html.escape(study.name)}</h1>",
        f"<p>objective: <b>{html.escape(space.objective)}</b> ({space.mode}), "
        f"{space.max_rounds} rounds per trial; trials: "
        + html.escape(", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())))
        + "</p>",
    ]
    rows = rows_of(ot) if ot is not None else []  # the trials read above, as rows
    if space.constraints:
        parts.append(f"<p>{html.escape(feasibility_line(space.constraints, rows))}</p>")
    top = best_of_rows(rows, space.mode)  # never an infeasible trial
    if top is None:
        parts.append("<p>best trial: none (no completed trial meets the constraints)</p>")
    else:
        parts.append(
            f"<p>best trial #{top['number']}: {space.objective} = {top['values'][0]:.4f} "
            f"({html.escape(format_params(top['params'], short=False))})</p>"
        )
    if space.multi_objective:
        parts.append("<h2>Pareto front</h2>")
        parts.append(
            _table(
                ["trial", *(f"{m} ({d})" for m, d in zip(space.metrics, space.modes or [])), "params"],
                [[t.number, *t.values, format_params(t.params, short=False)] for t in pareto_trials(study)],
            )
        )
    if summary is not None:
        parts.append("<h2>Re-evaluation over fresh seeds</h2>")
        parts.append(f"<p class='verdict'>{html.escape(summary['verdict'])}</p>")
        parts.append(
            _table(
                [
                    "config",
                    "search value",
                    f"{space.objective} mean [95% CI]",
                    "personal_test_acc mean [95% CI]",
                    f"Δ {space.objective} vs default [95% CI]",
                    "seeds",
                ],
                [
                    [
                        r["candidate"] + (" (best)" if r["candidate"] == summary["best"] else ""),
                        r.get("search_value"),
                        _interval(r.get(space.objective)),
                        _interval(r.get("personal_test_acc")),
                        _interval(r.get(f"diff_{space.objective}")),
                        len(r["seeds"]),
                    ]
                    for r in summary["rows"]
                ],
            )
        )

        header, body = report_card(summary, bounds=True)
        parts.append("<h2>Report card</h2>")
        parts.append(
            "<p>Per re-evaluated config, the mean and 95% CI over the fresh seeds, on the clients' test "
            "splits: sample-weighted and client-mean accuracy, its spread over clients, clients held out "
            "of training, harmed clients, and what a round ships and computes.</p>"
        )
        parts.append(_table(header, body))
    board = leaderboard(space, trials, compute, summary)
    if board:
        parts.append("<h2>Leaderboard (cross-method)</h2>")
        parts.append(
            _table(
                [
                    "method",
                    f"best {space.objective}",
                    "best trial",
                    "re-evaluated mean",
                    "trials",
                    "compute (rounds x clients)",
                ],
                [
                    [r["method"], r["best"], r["best_trial"], r["reeval_mean"], r["trials"], int(r["compute"])]
                    for r in board
                ],
            )
        )
    cost_header, cost_rows = cost_table(space, trials)
    if cost_rows:
        parts.append("<h2>Cost</h2>")
        parts.append(
            "<p>What each trial cost, as it last reported: bytes between server and clients (what the "
            "method ships: shared weights, prototypes, payloads; per sampled client), training FLOPs per round "
            "(an estimate: one forward and backward pass of the model per sample of every update) and the "
            "first evaluated round that reached eval.target_acc.</p>"
        )
        parts.append(_table(cost_header, cost_rows))
    parts.append("<h2>Figures</h2><div class='figures'>")
    for f in figures:
        wide = " class='wide'" if f.name in WIDE else ""
        if f.png is None:
            parts.append(
                f"<figure{wide}><figcaption>{html.escape(f.title)}</figcaption>"
                f"<p class='note'>{html.escape(f.note)}</p></figure>"
            )
        else:
            data = base64.b64encode(f.png).decode()
            parts.append(
                f"<figure{wide}><figcaption>{html.escape(f.title)}</figcaption>"
                f"<img alt='{html.escape(f.title)}' src='data:image/png;base64,{data}'></figure>"
            )
    parts.append("</div>")
    page = out_dir / "report.html"
    write_atomic(
        page,
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>autofl study {html.escape(study.name)}</title><style>{CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n",
    )
    return page

"""`autofl report` on a study built directly in Optuna (complete, pruned and failed trials with
round curves, a stored re-evaluation, a cross-method parameter): the page is self-contained and
names what it shows, every figure is also a PNG, and headless Chromium renders it."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution

from autofl.cli import main
from autofl.tuning.store.storage import open_storage
from autofl.tuning.store.study import StudyFolder
from conftest import STORAGE_KINDS, storage_line
from autofl.report import asha_milestones
from autofl.tuning.strategy.space import SearchSpace
from autofl.tuning.reeval import reevaluate  # noqa: F401  (the module whose summary format the page reads)

PNG = b"\x89PNG\r\n\x1a\n"


def _study(home: Path, storage: str = "sqlite") -> Path:
    """The study `rep` in `home`, on `storage` (conftest.STORAGE_KINDS: SQLite, a journal file)."""
    root = home / "rep"
    root.mkdir(parents=True)
    (root / "space.yaml").write_text(yaml.safe_dump({
        "study": "rep", "base": {"fl": {"rounds": 8}, "data": {"num_clients": 10}},
        "params": {"fl.lr": {"type": "float", "low": 0.001, "high": 1.0, "log": True},
                   "method.name": {"type": "categorical", "choices": ["fedavg", "fedprox"]}},
        "scheduler": {"kind": "asha", "grace_period": 2, "reduction_factor": 2}}) + storage_line(storage))
    ot = optuna.create_study(study_name="rep", storage=open_storage(StudyFolder(root).storage_url()), direction="maximize")
    dists = {"fl.lr": FloatDistribution(0.001, 1.0, log=True),
             "method.name": CategoricalDistribution(["fedavg", "fedprox"])}
    for i in range(8):
        lr, method = 0.001 * 2.5 ** i, ["fedavg", "fedprox"][i % 2]
        rounds = 8 if i % 3 == 0 else 2  # the others were pruned at the first rung
        curve = {r: 0.3 + 0.05 * r + 0.01 * i for r in range(1, rounds + 1)}
        state = optuna.trial.TrialState.COMPLETE if rounds == 8 else optuna.trial.TrialState.PRUNED
        ot.add_trial(optuna.trial.create_trial(params={"fl.lr": lr, "method.name": method}, distributions=dists,
                                               value=curve[rounds] if rounds == 8 else None,
                                               intermediate_values=curve, state=state))
    ot.add_trial(optuna.trial.create_trial(params={"fl.lr": 0.5, "method.name": "fedavg"}, distributions=dists,
                                           state=optuna.trial.TrialState.FAIL, intermediate_values={1: 0.1}))
    stat = lambda m, h: {"n": 3, "mean": m, "std": h, "ci_low": m - h, "ci_high": m + h}  # noqa: E731
    (root / "reeval").mkdir()
    (root / "reeval" / "summary.json").write_text(json.dumps({
        "objective": "personal_val_acc", "mode": "max", "seeds": [1000, 1001, 1002], "vary_partition": False,
        "best": "trial-6", "verdict": "not significant: trial-6 vs the paper default is within seed noise",
        "rows": [{"candidate": "default", "trial": 0, "params": {}, "search_value": 0.7, "seeds": [1000, 1001, 1002],
                  "personal_val_acc": stat(0.70, 0.02), "personal_test_acc": stat(0.69, 0.03)},
                 {"candidate": "trial-6", "trial": 6, "params": {"fl.lr": 0.729, "method.name": "fedavg"},
                  "search_value": 0.76, "seeds": [1000, 1001, 1002], "personal_val_acc": stat(0.72, 0.02),
                  "personal_test_acc": stat(0.70, 0.03), "diff_personal_val_acc": stat(0.02, 0.03)}]}))
    return root


def test_asha_rungs_follow_grace_period_and_reduction_factor():
    space = SearchSpace.model_validate({"study": "x", "base": {"fl": {"rounds": 20}},
                                        "scheduler": {"grace_period": 2, "reduction_factor": 3}})
    assert asha_milestones(space) == [2, 6, 18]
    assert asha_milestones(space.model_copy(update={"scheduler": space.scheduler.model_copy(update={"kind": "none"})})) == []


@pytest.mark.parametrize("storage", STORAGE_KINDS)
def test_report_is_one_offline_page_with_every_figure_as_png(tmp_path, storage):
    home = tmp_path / "home"
    root = _study(home, storage)
    out = tmp_path / "out"
    assert main(["report", "rep", "--dir", str(home), "-o", str(out)]) == 0
    page = (out / "report.html").read_text()
    pngs = {p.stem for p in out.glob("*.png")}
    assert {"best_vs_trial", "best_vs_compute", "round_curves", "importances", "slice_fl_lr", "slice_method_name",
            "parallel_coordinates", "reeval"} <= pngs
    for name in pngs:
        assert (out / f"{name}.png").read_bytes().startswith(PNG)
    # self-contained: every image is embedded, nothing is fetched, no script
    assert "<script" not in page and not re.search(r"(src|href)=['\"](?!data:)", page)
    embedded = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(embedded) == len(pngs) and all(base64.b64decode(e).startswith(PNG) for e in embedded)
    for text in ("Re-evaluation over fresh seeds", "within seed noise", "0.7200 [0.7000, 0.7400]",
                 "Leaderboard (cross-method)", "fedavg", "fedprox", "ASHA rungs", "fANOVA", "Parallel coordinates",
                 "3 complete, 1 fail, 5 pruned"):
        assert text in page, text
    assert main(["report", "rep", "--dir", str(home)]) == 0  # default folder: inside the study
    assert (root / "report" / "report.html").is_file()


def test_report_of_a_study_without_a_completed_trial_is_one_line(tmp_path, capsys):
    root = tmp_path / "home" / "empty"
    root.mkdir(parents=True)
    (root / "space.yaml").write_text(yaml.safe_dump({"study": "empty"}))
    optuna.create_study(study_name="empty", storage=f"sqlite:///{root / 'optuna.db'}")
    assert main(["report", "empty", "--dir", str(tmp_path / "home")]) == 2
    assert "no completed trial" in capsys.readouterr().err


def _chromium() -> str | None:
    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium (.ci/run installs chromium-headless-shell)")
def test_headless_chromium_renders_the_report(tmp_path):
    from PIL import Image

    home = tmp_path / "home"
    _study(home)
    out = tmp_path / "out"
    assert main(["report", "rep", "--dir", str(home), "-o", str(out)]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run([_chromium(), "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1200,3000",
                    (out / "report.html").as_uri()], capture_output=True, timeout=120, check=True)
    image = Image.open(shot).convert("L")
    assert image.size == (1200, 3000)
    # a rendered page, not a blank one: dark text and figures over a light background, across its height
    for top in (0, 1000, 2000):
        band = image.crop((0, top, 1200, top + 1000))
        low, high = band.getextrema()
        assert low < 80 and high > 200, (top, low, high)


def test_log_axes_have_plain_tick_labels_and_no_trial_is_drawn_white(tmp_path, monkeypatch):
    """Issue 42: the slice and parallel-coordinates figures printed raw `$\\mathdefault{10^{-1}}$`
    labels on the log-scale fl.lr and coloured the lowest trial white (Optuna's "Blues" starts at white)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from autofl import report
    from autofl.tuning.store.study import StudyFolder

    drawn = {}

    def keep(fig):  # the figure as the report saves it, drawn so that its tick labels are set
        fig.canvas.draw()
        labels = [t.get_text() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                  for t in axis.get_ticklabels(which="both") if t.get_visible()]
        colours = [c.get_facecolors() for ax in fig.axes for c in ax.collections]
        colours += [c.get_edgecolors() for ax in fig.axes for c in ax.collections if c.get_array() is not None]
        drawn[len(drawn)] = (fig.axes[0].get_title(), labels, colours)
        plt.close(fig)
        return b"png"

    monkeypatch.setattr(report, "_png", keep)
    report.build_report(StudyFolder(_study(tmp_path / "home")), tmp_path / "out")
    figures = {title: (labels, colours) for title, labels, colours in drawn.values()}
    slices = [v for t, v in figures.items() if "Slice" in t]
    parallel = figures["Parallel Coordinate Plot"]
    assert slices, list(figures)
    for labels, colours in [*slices, parallel]:
        assert labels and not any("mathdefault" in text or "$" in text for text in labels), labels
    assert any(text in ("0.01", "0.1", "1") for text in parallel[0]), parallel[0]
    for labels, colours in [*slices, parallel]:
        rgb = np.concatenate([c[:, :3] for c in colours if len(c)])
        assert (rgb.mean(axis=1) < 0.85).all(), "a trial drawn (near) white on white"

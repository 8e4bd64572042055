"""Re-evaluation over fresh seeds: the statistics on fixed numbers, the summary of stored runs
(paired differences, verdict), and end to end on a real study: runs recorded in the study, reused
by a later export, and finished by a second call after the driver is SIGKILLed."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autofl.tuning import reeval
from autofl.tuning.store.storage import open_storage
from autofl.tuning.store.study import StudyFolder
from conftest import STORAGE_KINDS
from test_search_e2e import AUTOFL, run, space_file


def test_t_interval_on_fixed_numbers():
    # mean 3, sample std sqrt(2.5), t(0.975, df=4) = 2.7764451, half = 2.7764451 * sqrt(2.5) / sqrt(5)
    stat = reeval.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert stat["n"] == 5 and stat["mean"] == pytest.approx(3.0)
    assert stat["std"] == pytest.approx(math.sqrt(2.5))
    assert stat["ci_low"] == pytest.approx(3.0 - half) and stat["ci_high"] == pytest.approx(3.0 + half)
    # two values: t(0.975, 1) = 12.7062047
    two = reeval.t_interval([0.90, 0.94])
    assert two["ci_high"] - two["mean"] == pytest.approx(12.706204736174698 * math.sqrt(0.0008) / math.sqrt(2))
    one = reeval.t_interval([0.5])
    assert one["mean"] == 0.5 and math.isnan(one["std"]) and math.isnan(one["ci_low"])


def _study_with_trials(tmp_path: Path, values: dict[float, float], mode: str = "max") -> StudyFolder:
    """A study folder whose Optuna study holds COMPLETE trials: fl.lr -> objective value. The first
    is the paper default (the base config's lr)."""
    root = tmp_path / "s"
    root.mkdir()
    lrs = list(values)
    (root / "space.yaml").write_text(yaml.safe_dump({
        "study": "s", "base": {"fl": {"rounds": 2, "lr": lrs[0]}}, "mode": mode,
        "params": {"fl.lr": {"type": "float", "low": 0.001, "high": 1.0}}}))
    ot = optuna.create_study(study_name="s", storage=f"sqlite:///{root / 'optuna.db'}",
                             direction="maximize" if mode == "max" else "minimize")
    for lr, value in values.items():
        ot.add_trial(optuna.trial.create_trial(params={"fl.lr": lr}, value=value,
                                               distributions={"fl.lr": optuna.distributions.FloatDistribution(0.001, 1.0)}))
    return StudyFolder(root)


def _record(study: StudyFolder, run: reeval.Run, val: float, test: float) -> None:
    reeval.record_run(study, run, {"round": 2, "personal_val_acc": val, "personal_test_acc": test})


def test_candidates_are_the_default_and_the_best_trials_without_repeating_the_default(tmp_path):
    study = _study_with_trials(tmp_path, {0.05: 0.80, 0.1: 0.90, 0.2: 0.85, 0.3: 0.70})
    chosen = reeval.candidates(study, top=2)
    assert [c.label for c in chosen] == ["default", "trial-1", "trial-2"]
    assert chosen[0].params == {} and chosen[0].trial == 0 and chosen[0].search_value == 0.80
    assert chosen[1].params == {"fl.lr": 0.1}
    assert reeval.fresh_seeds(study, 3) == [1000, 1001, 1002]


def test_summary_pairs_seeds_and_gives_a_plain_verdict(tmp_path):
    study = _study_with_trials(tmp_path, {0.05: 0.80, 0.1: 0.90})
    chosen, runs = reeval.plan(study, seeds=3, top=1, vary_partition=False)
    default = {r.seed: r for r in runs if r.candidate.label == "default"}
    best = {r.seed: r for r in runs if r.candidate.label == "trial-1"}
    # a consistent gain of 0.02, 0.03, 0.04 on the objective: significant
    for (seed, d), gain in zip(sorted(default.items()), (0.02, 0.03, 0.04)):
        _record(study, d, 0.80 + seed % 10 / 100, 0.7)
        _record(study, best[seed], 0.80 + seed % 10 / 100 + gain, 0.7 + gain / 2)
    summary = reeval.summarize(study, chosen, runs)
    row = {r["candidate"]: r for r in summary["rows"]}
    diff = row["trial-1"]["diff_personal_val_acc"]
    half = 4.302652729911275 * 0.01 / math.sqrt(3)  # t(0.975, 2) * std(0.02, 0.03, 0.04) / sqrt(3)
    assert diff["mean"] == pytest.approx(0.03) and diff["ci_low"] == pytest.approx(0.03 - half)
    assert row["trial-1"]["diff_personal_test_acc"]["mean"] == pytest.approx(0.015)
    assert row["default"]["personal_val_acc"]["mean"] == pytest.approx(0.81)
    assert summary["best"] == "trial-1" and summary["verdict"].startswith("significant: trial-1 beats")

    # gains of +0.05, -0.04, +0.02: the interval holds 0
    for (seed, d), gain in zip(sorted(default.items()), (0.05, -0.04, 0.02)):
        _record(study, best[seed], 0.80 + seed % 10 / 100 + gain, 0.7)
    summary = reeval.summarize(study, chosen, runs)
    assert summary["best"] == "trial-1" and summary["verdict"].startswith("not significant")
    assert "within seed noise" in summary["verdict"]

    # the default wins on the mean
    for seed, d in default.items():
        _record(study, d, 0.95, 0.9)
    summary = reeval.summarize(study, chosen, runs)
    assert summary["best"] == "default" and "paper default has the best mean" in summary["verdict"]


def test_minimized_objective_counts_a_lower_value_as_a_gain(tmp_path):
    study = _study_with_trials(tmp_path, {0.05: 0.30, 0.1: 0.20}, mode="min")
    chosen, runs = reeval.plan(study, seeds=2, top=1, vary_partition=False)
    for r in runs:
        _record(study, r, 0.3 if r.candidate.label == "default" else 0.2 + (r.seed % 2) / 1000, 0.5)
    summary = reeval.summarize(study, chosen, runs)
    assert summary["best"] == "trial-1" and summary["verdict"].startswith("significant")


def test_runs_keep_the_partition_unless_asked(tmp_path):
    study = _study_with_trials(tmp_path, {0.05: 0.8})
    _, runs = reeval.plan(study, seeds=2, top=1, vary_partition=False)
    assert runs[0].values(data_seed=0) == {"seed": 1000, "data.seed": 0}
    _, varied = reeval.plan(study, seeds=2, top=1, vary_partition=True)
    assert varied[1].values(data_seed=0) == {"seed": 1001} and varied[1].key.endswith("-newpartition")


def _unpruned_space(tmp_path: Path, study: str, trials: int, rounds: int) -> Path:
    """The end-to-end tests' space without ASHA: every trial completes and can be re-evaluated."""
    path = space_file(tmp_path, study, trials, rounds)
    space = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**space, "scheduler": {"kind": "none"}}))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("storage", STORAGE_KINDS)
def test_reeval_is_stored_reused_by_export_and_shown_by_status(tmp_path, storage):
    home = tmp_path / "home"
    space = _unpruned_space(tmp_path, "rv", trials=3, rounds=3)
    if storage == "journal":  # a journal file in the study folder; population trials (issue 37): the
        # search's and re-evaluation's configs train two per trial, each seed's candidates as one population
        tree = yaml.safe_load(space.read_text())
        tree["resources"] = {**tree.get("resources", {}), "population": 2}
        space.write_text(yaml.safe_dump({**tree, "storage": "journal://optuna.log"}))
    proc = run(["search", "--space", space, "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run(["reeval", "rv", "--seeds", 2, "--top", 1, "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 to run" in proc.stdout and "verdict:" in proc.stdout
    cohorts = list((home / "rv" / "tune").glob("reeval-*/RunListCohortTrainable_*"))
    assert len(cohorts) == (2 if storage == "journal" else 0)  # with a population: one trial per seed
    records = sorted((home / "rv" / "reeval" / "runs").glob("*.json"))
    assert [p.stem for p in records][:2] == ["default-seed1000", "default-seed1001"] and len(records) == 4
    stamps = {p: p.stat().st_mtime_ns for p in records}
    summary = json.loads((home / "rv" / "reeval" / "summary.json").read_text())
    ot = optuna.load_study(study_name="rv", storage=open_storage(StudyFolder(home / "rv").storage_url()))
    assert ot.user_attrs["reeval"]["best"] == summary["best"] and len(summary["rows"]) == 2
    for row in summary["rows"]:
        assert row["seeds"] == [1000, 1001] and row["personal_test_acc"]["n"] == 2

    out = tmp_path / "best.yaml"
    # export re-evaluates on 2 fresh seeds unless --reeval says otherwise: the runs `reeval` made are reused
    proc = run(["best-config", "export", "rv", "--top", 1, "-o", out, "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 already done, 0 to run" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in records} == stamps  # nothing recomputed
    meta = yaml.safe_load(out.read_text())["metadata"]
    assert meta["reeval"]["verdict"] == summary["verdict"] and len(meta["reeval"]["table"]) == 2
    best = next(r for r in summary["rows"] if r["candidate"] == summary["best"])
    assert meta["trial"] == best["trial"]

    # a re-evaluation run is an ordinary run of that config with that seed: `autofl train` repeats it
    config = yaml.safe_load(out.read_text())
    config["seed"], config["data"]["seed"] = 1001, 0
    (tmp_path / "seed1001.yaml").write_text(yaml.safe_dump(config))
    proc = run(["train", "--config", tmp_path / "seed1001.yaml", "--out", tmp_path / "t"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads((tmp_path / "t" / "metrics.jsonl").read_text().splitlines()[-1])
    record = json.loads((home / "rv" / "reeval" / "runs" / f"{summary['best']}-seed1001.json").read_text())
    assert record["metrics"]["personal_test_acc"] == pytest.approx(last["personal_test_acc"], abs=1e-9)

    status = run(["status", "rv", "--dir", home])
    assert status.returncode == 0 and "re-evaluation over 2 fresh seeds" in status.stdout
    assert summary["verdict"][:40] in " ".join(status.stdout.split())


@pytest.mark.slow
def test_a_killed_reeval_is_finished_by_a_second_call(tmp_path):
    home = tmp_path / "home"
    proc = run(["search", "--space", _unpruned_space(tmp_path, "rk", trials=2, rounds=12), "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = home / "rk" / "reeval" / "runs"
    driver = subprocess.Popen([*AUTOFL, "reeval", "rk", "--seeds", "3", "--top", "1", "--dir", str(home)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None and len(list(records.glob("*.json"))) < 1:
        time.sleep(0.2)
    assert driver.poll() is None, "the re-evaluation finished before it could be killed; make it longer"
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = {p.name: p.read_text() for p in records.glob("*.json")}
    assert 1 <= len(before) < 6

    proc = run(["reeval", "rk", "--seeds", 3, "--top", 1, "--dir", home])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(before)} already done, {6 - len(before)} to run" in proc.stdout
    after = {p.name: p.read_text() for p in records.glob("*.json")}
    assert len(after) == 6 and all(after[k] == v for k, v in before.items())
    summary = json.loads((home / "rk" / "reeval" / "summary.json").read_text())
    assert all(row["seeds"] == [1000, 1001, 1002] for row in summary["rows"])

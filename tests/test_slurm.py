"""Studies as SLURM jobs (`autofl slurm`): the batch script and its options, and a study on a real
one-node SLURM (Debian's slurm-wlm and munge, started by tests/slurm_cluster.py; `.ci/run` installs
them when missing) that receives the time-limit signal mid-study, is requeued, resumes, and ends
with the trials and values of an uninterrupted run, on a journal in the study folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import optuna
import pytest
import yaml

from autofl.tuning.store.storage import open_storage
from slurm_cluster import SlurmCluster, serve_slurm

AUTOFL = [sys.executable, "-m", "autofl.cli"]
ROUNDS = 16  # ~5 s a trial here: the signal lands while the study runs


def space_file(tmp_path: Path, study: str = "hpc", gpu: float = 0) -> Path:
    """A deterministic study: a grid of 4 learning rates, one trial at a time, none pruned, a
    checkpoint every round."""
    path = tmp_path / f"{study}.yaml"
    path.write_text(yaml.safe_dump({
        "study": study,
        "base": {"data": {"num_clients": 4}, "fl": {"rounds": ROUNDS}, "method": {"name": "fedavg"}},
        "params": {"fl.lr": {"type": "categorical", "choices": [0.02, 0.05, 0.1, 0.2]}},
        "trials": 4, "sampler": {"kind": "grid"}, "scheduler": {"kind": "none"},
        "resources": {"cpu": 1, "gpu": gpu, "max_concurrent": 1}, "checkpoint_every_s": 0,
    }))
    return path


def run(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*AUTOFL, *map(str, args)], capture_output=True, text=True, timeout=900, env=env)


def test_dry_run_prints_rays_slurm_pattern_and_creates_nothing(tmp_path):
    home = tmp_path / "home"
    proc = run("slurm", "--space", space_file(tmp_path), "--dir", home, "--dry-run", "--nodes", 3,
               "--cpus-per-node", 8, "--gpus-per-node", 2, "--time", "1-00:00:00", "--signal-before", 600,
               "--partition", "gpu", "--sbatch=--constraint=a100", "--setup", "module load cuda")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --gpus-per-task=2", "#SBATCH --time=1-00:00:00", "#SBATCH --signal=B:USR1@600",
                 "#SBATCH --requeue", "#SBATCH --partition=gpu", "#SBATCH --constraint=a100", "module load cuda",
                 f"#SBATCH --output={home / 'hpc' / 'slurm'}/slurm-%j.out", "--num-gpus=2",
                 "search --resume hpc", 'scontrol requeue "$SLURM_JOB_ID"'):
        assert line in script, line
    assert script.count("$RAY start --head") == 1 and "$RAY start --address=\"$address\"" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # the shell parses it
    assert not home.exists()  # a dry run makes nothing


@pytest.mark.parametrize("flags,line", [
    (["--time", "0:30"], "--time: '0:30' is under a minute"),
    (["--time", "soon"], "--time: 'soon' is not a time limit"),
    (["--time", "00:10:00", "--signal-before", "900"], "--signal-before: 900 s is not before the time limit"),
    (["--partition", "a b"], "--partition: 'a b' is not a SLURM name"),
    (["--mem", "lots"], "--mem: 'lots' is not a memory size"),
    (["--sbatch", "constraint=a100"], "is not an sbatch option"),
    (["--python", "python3"], "--python: 'python3' is a relative path"),
    (["--cpus-per-node", "0"], "argument --cpus-per-node: 0 CPUs; allowed: 1 or more"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, flags, line):
    home = tmp_path / "home"
    proc = run("slurm", "--space", space_file(tmp_path), "--dir", home, *flags)
    assert proc.returncode == 2 and line in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not home.exists()


def test_a_trial_that_asks_for_a_gpu_needs_gpus_per_node(tmp_path):
    home = tmp_path / "home"
    proc = run("slurm", "--space", space_file(tmp_path, gpu=0.5), "--dir", home, "--dry-run")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "gpus_per_node: 0, but one trial asks for resources.gpu: 0.5" in proc.stderr
    proc = run("slurm", "--space", space_file(tmp_path, gpu=0.5), "--dir", home, "--dry-run", "--gpus-per-node", 1)
    assert proc.returncode == 0 and "#SBATCH --gpus-per-task=1" in proc.stdout, proc.stderr


def test_a_split_that_gives_no_client_a_sample_is_one_line_before_anything_is_made(tmp_path):
    """As `autofl search` checks it: the study is not created and submitted to fail on the cluster."""
    path = space_file(tmp_path)
    tree = yaml.safe_load(path.read_text())
    tree["base"]["data"] = {"split": {"train": 0.799, "val": 0.001, "test": 0.2}}  # the default clients
    path.write_text(yaml.safe_dump(tree))
    home = tmp_path / "home"
    proc = run("slurm", "--space", path, "--dir", home, "--dry-run")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "data.split.val: 0.001 gives no client a validation sample" in proc.stderr
    assert not home.exists()


def test_without_sbatch_nothing_is_created(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, ray: no SLURM
    proc = run("slurm", "--space", space_file(tmp_path), "--dir", home, env=env)
    assert proc.returncode == 2 and "sbatch: not found" in proc.stderr and proc.stderr.count("\n") == 1
    assert not home.exists()


# ---- on a real SLURM -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from serve_slurm()


def trials_of(url: str, name: str):
    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials()


def wait_until(predicate, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_signalled_study_is_requeued_and_ends_as_an_uninterrupted_run(slurm, tmp_path):
    home = tmp_path / "home"  # the "shared filesystem": the job's nodes see the study folder
    env = {**slurm.env, "PYTHONPATH": os.pathsep.join(p for p in [str(Path(__file__).parents[1]),
                                                                   os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("AUTOFL_STORAGE", None)
    space = space_file(tmp_path)
    # the uninterrupted run, alongside the job (a local Ray of its own)
    reference = subprocess.Popen([*AUTOFL, "search", "--space", str(space), "--name", "reference", "--dir",
                                  str(tmp_path / "ref")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=env)
    proc = subprocess.run([*AUTOFL, "slurm", "--space", str(space), "--dir", str(home), "--cpus-per-node", "2",
                           "--time", "30", "--signal-before", "60"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split("submitted job ")[1].split()[0]
    study = home / "hpc"
    url = f"journal://{study / 'optuna.log'}"
    out = study / "slurm" / f"slurm-{job}.out"

    def finished() -> int:
        try:
            return sum(t.state.is_finished() for t in trials_of(url, "hpc"))
        except KeyError:  # not created yet
            return 0

    wait_until(lambda: finished() >= 1 or slurm.job_ended(job), "the first trial")
    assert finished() < 4 and slurm.job_state(job)[0] == "RUNNING", out.read_text()[-3000:]
    slurm.run("scancel", "--signal=USR1", "--batch", job)  # what SLURM sends signal_before_s before the limit
    before = {t.number: (t.state.name, t.params, t.value) for t in trials_of(url, "hpc") if t.state.is_finished()}
    wait_until(lambda: slurm.job_state(job)[0] == "PENDING" or slurm.job_ended(job), "the requeue")
    assert slurm.job_state(job)[0] == "PENDING", out.read_text()[-3000:] + slurm.describe(job)
    # SLURM holds a requeued job back 2 min; the test lets it start at once, but not within the second of
    # the requeue: slurmd revoked the killed run's credentials at that second, and a launch whose credential
    # bears the same second is refused ("Job N already killed, do not launch batch job") and the job FAILS
    time.sleep(2)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    # an end seen twice, 2 s apart: one read of a requeued job between its runs is no end
    wait_until(lambda: slurm.job_ended(job) and (time.sleep(2) or slurm.job_ended(job)), "the requeued job's end",
               seconds=600)
    log = out.read_text()
    assert "time limit is near" in log and f"requeueing job {job}" in log and "(run 2)" in log, log[-3000:] + slurm.describe(job)
    assert "autofl search exited with 0" in log, log[-3000:] + slurm.describe(job)

    assert reference.wait(timeout=600) == 0, reference.communicate()[0][-3000:]
    expected = {t.params["fl.lr"]: (t.state.name, t.value) for t in trials_of(
        f"sqlite:///{tmp_path / 'ref' / 'reference' / 'optuna.db'}", "reference")}
    after = trials_of(url, "hpc")
    assert all(t.state.is_finished() for t in after), [t.state.name for t in after]
    for number, state in before.items():  # nothing finished before the signal changed
        assert (after[number].state.name, after[number].params, after[number].value) == state
    real = [t for t in after if not t.user_attrs.get("interrupted")]
    assert len(real) == 4 and len({t.user_attrs["tune_trial_id"] for t in real}) == 4
    assert {t.params["fl.lr"]: (t.state.name, t.value) for t in real} == expected
    runs = {t.user_attrs["tune_run"] for t in real}
    assert runs == {"run-1"}, runs  # the requeued job resumed the interrupted run, it did not start another

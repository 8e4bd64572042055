"""A throw-away one-node SLURM cluster for tests: Debian's `slurm-wlm` and `munge`, with munged,
slurmctld and slurmd started from a temp folder (their own key, socket, config, state and logs),
the controller on 127.0.0.1, and all of them stopped by the fixture that started them."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
START_TIMEOUT_S = 60
# the states of a job that ran and will not run again (scontrol shows them for MinJobAge)
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED", "GONE"})


@dataclass
class SlurmCluster:
    folder: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        """The environment SLURM's commands (and jobs, which inherit it) find this cluster with."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=60, check=check)

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job SLURM still knows (COMPLETED and the other ends included, for
        MinJobAge), else ("GONE", ""). A controller that does not answer is asked again: CI (2 cores,
        a search beside the job) once read a timed-out query as the job's end."""
        for _ in range(30):
            proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
            if proc.returncode == 0:
                fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
                return fields["JobState"], fields.get("Reason", "")
            if "Invalid job id" in proc.stderr:
                return "GONE", ""
            time.sleep(1.0)
        raise AssertionError(f"scontrol show job {job_id} failed 30 times: {proc.stderr}")

    def job_ended(self, job_id: str) -> bool:
        return self.job_state(job_id)[0] in ENDED

    def describe(self, job_id: str, lines: int = 40) -> str:
        """What SLURM says of a job and the tail of its daemons' logs: what a failed test prints
        (CI, 2026-11-27, once saw a requeued job end without its second run)."""
        shown = self.run("scontrol", "show", "job", job_id, check=False)
        return f"--- scontrol show job {job_id}\n{shown.stdout or shown.stderr}" + log_tail(
            self.folder, ("slurmctld.log", "slurmd.log"), lines)


def log_tail(folder: Path, names: tuple[str, ...], lines: int) -> str:
    """The last `lines` lines of each of the daemons' files `names` in `folder` that exists."""
    text = ""
    for name in names:
        path = folder / name
        if path.exists():
            text += f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_commands() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]


def _command(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmProcesses:
    """munged, slurmctld and slurmd of one test cluster (the daemons in the foreground, as our
    children, so that stop() ends exactly them)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="autofl-slurm-"))
        self.procs: list[subprocess.Popen] = []
        self.munged_pid: int | None = None

    def _config(self) -> Path:
        f = self.folder
        (f / "state").mkdir()
        (f / "spool").mkdir()
        cpus = 2
        conf = f / "slurm.conf"
        conf.write_text("\n".join([
            "ClusterName=autofltest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CryptoType=crypto/munge",
            f"AuthInfo=socket={f / 'munge.sock'}",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        return conf

    def start(self) -> SlurmCluster:
        f = self.folder
        key = f / "munge.key"
        subprocess.run([_command("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True, timeout=60)
        subprocess.run([_command("munged"), "--force", f"--socket={f / 'munge.sock'}", f"--key-file={key}",
                        f"--log-file={f / 'munged.log'}", f"--pid-file={f / 'munged.pid'}",
                        f"--seed-file={f / 'munged.seed'}"], check=True, capture_output=True, timeout=60)
        self.munged_pid = int((f / "munged.pid").read_text().split()[0])
        conf = self._config()
        env = {**os.environ, "SLURM_CONF": str(conf)}
        for argv in ([_command("slurmctld"), "-D", "-f", str(conf)],
                     [_command("slurmd"), "-D", "-N", "localhost", "-f", str(conf)]):
            log = open(f / f"{Path(argv[0]).name}.out", "w")
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
            log.close()
        cluster = SlurmCluster(f, conf)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            proc = cluster.run("sinfo", "-h", "-o", "%t", check=False)
            if proc.returncode == 0 and proc.stdout.strip() == "idle":
                return cluster
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        raise RuntimeError(f"SLURM did not start: {self.log_tail()}")

    def log_tail(self) -> str:
        return log_tail(self.folder, ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"), 15)

    def stop(self) -> None:
        conf = self.folder / "slurm.conf"
        if self.procs and conf.exists():  # a test that failed midway: its jobs end before the daemons do
            cluster = SlurmCluster(self.folder, conf)
            def jobs() -> list[str]:
                return cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()

            if jobs():
                cluster.run("scancel", *jobs(), check=False)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and jobs():
                    time.sleep(0.5)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.munged_pid is not None:
            try:
                os.kill(self.munged_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def serve_slurm() -> Iterator[SlurmCluster]:
    """A one-node SLURM cluster for a test module's fixture: skips (one line) where SLURM is not
    installed or cannot start here, and is stopped when the module is done."""
    import pytest

    missing = missing_commands()
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge "
                    f"(.ci/run does this when it can)")
    if os.geteuid() != 0:
        pytest.skip("the test SLURM cluster runs its daemons as root (SlurmUser=root); run the tests as root")
    processes = SlurmProcesses()
    try:
        try:
            cluster = processes.start()
        except (RuntimeError, subprocess.SubprocessError, OSError) as err:
            pytest.skip(f"SLURM could not start here: {' '.join(str(err).split())[:300]}")
        yield cluster
    finally:
        processes.stop()

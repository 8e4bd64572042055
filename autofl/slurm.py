"""Studies on a SLURM cluster: the batch script `autofl slurm` writes and submits.

The script follows Ray's SLURM launch pattern (one task per node): a Ray head on the job's first
node, a Ray worker on each other node (`srun ... ray start --block`), each with the job's CPUs and
GPUs per node; then `autofl search --resume NAME --address HEAD` drives the study on that cluster,
and the Ray steps are stopped at the end. The study was created when the job was submitted, so
the first run and every requeued run are the same command.

Time limits: the job asks SLURM for `--signal=B:USR1@SECONDS` and `--requeue`. On USR1 (the
time limit is near) the script sends the driver SIGTERM, which autofl handles as Ctrl-C: Tune
saves the experiment (searcher, trials, their checkpoints) and the driver exits 130; the script
then stops Ray and requeues its own job (`scontrol requeue`), whose next run resumes the study
where it stopped. A SIGTERM from SLURM (scancel, preemption) is passed on the same way, without
the requeue (a preempted job that SLURM requeues resumes the same way).

Everything the job writes lies in the study folder, which must be on a filesystem every node
reaches: space.yaml, study.json, the Optuna journal (`journal://optuna.log`, the default here:
SQLite is not safe on NFS), Tune's experiments, and `slurm/` (this script, `slurm-JOBID.out`).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autofl.errors import AutoFLError, ConfigError, format_validation_error

SLURM_DIR = "slurm"  # in the study folder: the batch script and the job's output
SCRIPT_FILE = "job.sbatch"
DEFAULT_JOURNAL = "journal://optuna.log"  # a journal file in the study folder
SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:-]{0,127}")  # partitions, accounts, QOS
MEMORY = re.compile(r"[0-9]+[KMGT]?")
TIME_FORMATS = (
    "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES or DAYS-HOURS:MINUTES:SECONDS"
)
SUBMIT_TIMEOUT_S = 60
CLI_FLAGS = {"signal_before_s": "--signal-before"}  # where `autofl slurm` spells an option otherwise than --a-b
BASE_PORT, PORT_SPAN = 20000, 20000  # the Ray head's port: BASE_PORT + job id mod PORT_SPAN (and that + 2)


def time_limit_seconds(text: str) -> int:
    """SLURM's --time formats, in seconds; ValueError for anything else."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a time limit; allowed: {TIME_FORMATS}")
    days, first, second, third = match.groups()
    if days is not None:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        return int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    if third is not None:  # HOURS:MINUTES:SECONDS
        return int(first) * 3600 + int(second) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # MINUTES[:SECONDS]


def _one_line(value: str, what: str) -> str:
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"{what} must be one line")
    return value


class SlurmOptions(BaseModel):
    """What the job asks SLURM for, and what the script runs before autofl (one trial's resources
    are the space's `resources:`; Ray packs as many trials per node as fit)."""

    model_config = ConfigDict(extra="forbid")

    nodes: int = Field(1, ge=1, le=100_000, description="nodes: a Ray head on the first, a worker on each other")
    cpus_per_node: int = Field(4, ge=1, le=100_000, description="CPUs per node given to Ray")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node given to Ray (--gpus-per-task)")
    time: str = Field("01:00:00", description=f"the job's time limit ({TIME_FORMATS})")
    signal_before_s: int = Field(
        300,
        ge=30,
        description="seconds before the time limit that SLURM sends USR1: "
        "the study is saved and the job requeued (SLURM may send it up to 60 s early)",
    )
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    mem: str | None = Field(None, description="memory per node (sbatch --mem), e.g. 64G")
    job_name: str | None = Field(None, description="default: autofl-<study>")
    sbatch: list[str] = Field(default_factory=list, description="more sbatch options, e.g. --constraint=a100")
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run first on the nodes' batch shell, "
        "e.g. 'module load cuda' or 'source ~/venv/bin/activate'",
    )
    python: str = Field(
        default_factory=lambda: sys.executable,
        description="the Python with autofl and Ray installed, as every node sees it (default: this one)",
    )

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        seconds = time_limit_seconds(value)
        if seconds < 60:
            raise ValueError(f"{value!r} is under a minute; allowed: {TIME_FORMATS}, at least 1 minute")
        return value.strip()

    @field_validator("partition", "account", "qos", "job_name")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a SLURM name; allowed: letters, digits, '_', '.', '+', ':', '-'")
        return value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not MEMORY.fullmatch(value):
            raise ValueError(f"{value!r} is not a memory size; allowed: a number with K, M, G or T, e.g. 64G")
        return value

    @field_validator("sbatch")
    @classmethod
    def _sbatch(cls, value: list[str]) -> list[str]:
        for option in value:
            _one_line(option, "each sbatch option")
            if not option.startswith("--") or len(option) < 3 or option.strip() != option:
                raise ValueError(
                    f"{option!r} is not an sbatch option; allowed: --NAME or --NAME=VALUE, e.g. --constraint=a100"
                )
        return value

    @field_validator("setup")
    @classmethod
    def _setup(cls, value: list[str]) -> list[str]:
        for line in value:
            _one_line(line, "each setup line")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        _one_line(value, "python")
        if not os.path.isabs(value):
            raise ValueError(f"{value!r} is a relative path; allowed: the absolute path of a Python every node runs")
        return value

    @model_validator(mode="after")
    def _signal_within_limit(self) -> SlurmOptions:
        limit = time_limit_seconds(self.time)
        if self.signal_before_s >= limit:
            raise ValueError(
                f"signal_before_s: {self.signal_before_s} s is not before the time limit "
                f"{self.time} ({limit} s); allowed: 30 to {limit - 1}"
            )
        return self

    @property
    def time_s(self) -> int:
        return time_limit_seconds(self.time)


def parse_options(options: SlurmOptions | dict[str, Any] | None, flags: bool = False) -> SlurmOptions:
    """`options` validated; bad input is one ConfigError line naming the option (`--cpus-per-node`
    when `flags`, the CLI's spelling, else `cpus_per_node`)."""
    if isinstance(options, SlurmOptions):
        return options
    try:
        return SlurmOptions.model_validate(options or {})
    except ValidationError as err:
        line = format_validation_error(err, SlurmOptions)
        if flags:
            for name in SlurmOptions.model_fields:
                flag = CLI_FLAGS.get(name, "--" + name.replace("_", "-"))
                line = re.sub(rf"^{name}(?=:)", flag, line)  # the key the line starts with
        raise ConfigError(line) from None


def check_fits(options: SlurmOptions, cpu: float, gpu: float) -> None:
    """One trial of the space must fit on one node of the job."""
    if cpu > options.cpus_per_node:
        raise ConfigError(
            f"cpus_per_node: {options.cpus_per_node}, but one trial asks for resources.cpu: {cpu:g}; "
            f"allowed: at least {cpu:g}"
        )
    if gpu > options.gpus_per_node:
        raise ConfigError(
            f"gpus_per_node: {options.gpus_per_node}, but one trial asks for resources.gpu: {gpu:g}; "
            f"allowed: at least {gpu:g} (give trials GPUs with gpus_per_node and the space's "
            f"resources.gpu)"
        )


def ray_command(python: str) -> str:
    """The `ray` command next to `python` (its virtual environment's), else `python -m` Ray's CLI."""
    beside = Path(python).parent / "ray"
    return shlex.quote(str(beside)) if beside.is_file() else f"{shlex.quote(python)} -m ray.scripts.scripts"


def render_script(study_root: Path, options: SlurmOptions) -> str:
    """The sbatch script that runs the study in `study_root` (which must exist when it runs)."""
    name = study_root.name
    q = shlex.quote
    home, folder = study_root.parent, study_root / SLURM_DIR
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={options.job_name or 'autofl-' + name}",
        f"#SBATCH --nodes={options.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={options.cpus_per_node}",
        *([f"#SBATCH --gpus-per-task={options.gpus_per_node}"] if options.gpus_per_node else []),
        f"#SBATCH --time={options.time}",
        *([f"#SBATCH --partition={options.partition}"] if options.partition else []),
        *([f"#SBATCH --account={options.account}"] if options.account else []),
        *([f"#SBATCH --qos={options.qos}"] if options.qos else []),
        *([f"#SBATCH --mem={options.mem}"] if options.mem else []),
        f"#SBATCH --signal=B:USR1@{options.signal_before_s}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={folder}/slurm-%j.out",
        *[f"#SBATCH {option}" for option in options.sbatch],
        f"# written by autofl slurm for study {name}; the study folder and its journal lie on the shared filesystem",
        "set -u",
        *options.setup,
        f"PYTHON={q(options.python)}",
        f"RAY={ray_command(options.python)}",
        f"export AUTOFL_HOME={q(str(home))}",
        "export RAY_AUTH_MODE=token  # only this job's processes may use its Ray cluster",
        "RAY_AUTH_TOKEN=\"$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')\"",
        "export RAY_AUTH_TOKEN",
        'echo "autofl slurm: job $SLURM_JOB_ID (run $((${SLURM_RESTART_COUNT:-0} + 1))) on $SLURM_JOB_NODELIST"',
        "driver=''",
        "near_limit=0",
        "on_usr1() {",
        "    near_limit=1",
        '    echo "autofl slurm: the time limit is near (USR1): saving the study; the job is requeued to resume it"',
        '    if [ -n "$driver" ]; then kill -TERM "$driver" 2>/dev/null; fi',
        "}",
        "trap on_usr1 USR1",
        'trap \'if [ -n "$driver" ]; then kill -TERM "$driver" 2>/dev/null; fi\' TERM  # scancel, preemption: '
        "the study is saved as well",
        "",
        "# Ray's SLURM pattern: a head on the first node, a worker on each other node, one task per node",
        'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "head_node=${nodes[0]}",
        'head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | tr " " "\\n" | '
        "grep -m1 -E '^[0-9.]+$')",
        "head_ip=${head_ip:-$head_node}",
        f"port=$(({BASE_PORT} + SLURM_JOB_ID % {PORT_SPAN}))  # per job: jobs sharing a node do not collide",
        'address="$head_ip:$port"',
        f'ray_options=(--num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus={options.gpus_per_node} '
        "--dashboard-agent-listen-port=$((port + 2)) --disable-usage-stats --block)",
        'srun --nodes=1 --ntasks=1 -w "$head_node" $RAY start --head --node-ip-address="$head_ip" --port="$port" \\',
        '    --include-dashboard=false --temp-dir="/tmp/autofl-ray-$SLURM_JOB_ID" "${ray_options[@]}" &',
        "ray_steps=($!)",
        '"$PYTHON" -m autofl.slurm wait-ray "$address" 1 120 "$ray_steps" || { echo "autofl slurm: the Ray head did '
        'not start"; kill "${ray_steps[@]}" 2>/dev/null; exit 1; }',
        "for ((i = 1; i < ${#nodes[@]}; i++)); do",
        '    srun --nodes=1 --ntasks=1 -w "${nodes[$i]}" $RAY start --address="$address" "${ray_options[@]}" &',
        "    ray_steps+=($!)",
        "done",
        *(
            [
                '"$PYTHON" -m autofl.slurm wait-ray "$address" "${#nodes[@]}" 300 || echo "autofl slurm: not every node '
                'joined Ray; the study runs on those that did"'
            ]
            if options.nodes > 1
            else []
        ),
        "",
        "# the study: created at submission, so the first run and every requeued run resume it",
        "status=130",
        'if [ "$near_limit" = 0 ]; then',
        f'    "$PYTHON" -m autofl.cli search --resume {q(name)} --dir "$AUTOFL_HOME" --address "$address" &',
        "    driver=$!",
        '    if [ "$near_limit" = 1 ]; then kill -TERM "$driver"; fi  # the signal came as it started',
        '    while kill -0 "$driver" 2>/dev/null; do wait "$driver"; done',
        '    wait "$driver"; status=$?',
        "fi",
        "",
        "# stop Ray: the steps end their nodes' Ray processes",
        'kill -TERM "${ray_steps[@]}" 2>/dev/null',
        'wait "${ray_steps[@]}" 2>/dev/null',
        'if [ "$near_limit" = 1 ] && [ "$status" = 130 ]; then',
        '    echo "autofl slurm: study saved; requeueing job $SLURM_JOB_ID to resume it"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "    exit 0",
        "fi",
        'echo "autofl slurm: autofl search exited with $status"',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Submission:
    """What `autofl slurm` made: the script's text and file, and the job id (None: a dry run)."""

    study: str
    script: str
    script_path: Path
    job_id: str | None


def sbatch_command() -> str:
    found = shutil.which("sbatch")
    if found is None:
        raise AutoFLError(
            "sbatch: not found; run autofl slurm on a SLURM login node (or print the script with --dry-run)"
        )
    return found


def submit_script(path: Path) -> str:
    """`sbatch` the script; its job id, or one AutoFLError line with sbatch's reason."""
    try:
        proc = subprocess.run(
            [sbatch_command(), "--parsable", str(path)], capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise AutoFLError(f"sbatch: no answer within {SUBMIT_TIMEOUT_S} s; is slurmctld up? (sinfo)") from None
    if proc.returncode != 0:
        reason = " ".join((proc.stderr or proc.stdout).split()) or f"exit {proc.returncode}"
        raise AutoFLError(f"sbatch: refused the job ({reason[:300]}); the script is {path}")
    return proc.stdout.strip().split(";")[0]


# ---- on the nodes: wait until Ray's nodes have joined -----------------------------------------
def wait_for_ray(address: str, nodes: int, seconds: float, step_pid: int | None = None) -> bool:
    """Whether `nodes` Ray nodes are alive at `address` within `seconds` (the head first answers
    on its port, then its nodes register); False at once if the process `step_pid` (the head's
    srun) has ended."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline or (step_pid is not None and not _alive(step_pid)):
                return False
            time.sleep(0.5)
    import ray  # the port answers before the node has registered: wait for the nodes themselves

    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        while sum(1 for n in ray.nodes() if n.get("Alive")) < nodes:
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        return True
    finally:
        ray.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    if len(argv) in (4, 5) and argv[0] == "wait-ray":
        return 0 if wait_for_ray(argv[1], int(argv[2]), float(argv[3]), int(argv[4]) if len(argv) == 5 else None) else 1
    print("usage: python -m autofl.slurm wait-ray HOST:PORT NODES SECONDS [PID]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

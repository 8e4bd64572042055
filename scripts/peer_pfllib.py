"""Time PFLlib's own FL rounds on bench_round.py's fedfcd-t1 workload, for a same-run comparison.

    git clone https://github.com/TsingZ0/PFLlib /path/to/PFLlib
    AUTOFL_DATA_ROOT=/path/to/datasets python scripts/peer_pfllib.py --pfllib /path/to/PFLlib \
        [--algo FedAvg FedProto] [--rounds 4]

The workload is PFLlib's own Fashion-MNIST generator (`generate_FashionMNIST.py noniid - pat`: train and
test pooled, pathological 2 classes per client, 20 clients, 75/25 split per client) and its `DNN(784, 100,
10)`, batch 10, lr 0.01, one local epoch, every client each round, on CPU: the fedfcd-t1 scenario of
`scripts/bench_round.py` (FedFCD's Table 1 ran PFLlib). The data is generated once, from
`$AUTOFL_DATA_ROOT/FashionMNIST` (linked as PFLlib's rawdata, so nothing is downloaded).

PFLlib's main.py imports every algorithm's dependencies; the ones FedAvg and FedProto never call
(cvxpy, h5py, calmsize) are stood in for by empty modules, and ujson by the standard json module, so
PFLlib runs in autofl's environment unchanged. Evaluation runs only in round 0 (`-eg` past the run),
which is dropped; the line printed per algorithm is PFLlib's own per-round wall time (its `Budget`),
median over the rounds after the first, the same statistic bench_round.py prints.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import re
import runpy
import statistics
import subprocess
import sys
import types
from pathlib import Path

STAND_INS = {"cvxpy", "h5py", "calmsize"}
TIMED_ROUNDS = 4  # rounds timed after round 0
ROUND_LINE = re.compile(r"^-{25,}(?: time cost -+)? ([0-9.]+)\s*$")


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "ujson":
            return json
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package, so submodule imports resolve to stand-ins too
        module.__getattr__ = lambda attr: None  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        root = name.split(".")[0]
        if root in STAND_INS or name == "ujson":
            return importlib.machinery.ModuleSpec(name, _StandInLoader())
        return None


def run_inside(script: str, args: list[str]) -> None:
    """Run one of PFLlib's scripts in this process, with the stand-ins installed (after every real
    finder, so an installed package is used where there is one)."""
    sys.meta_path.append(_StandInFinder())
    sys.path.insert(0, str(Path(script).parent))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def generate(pfllib: Path, data_root: Path) -> None:
    folder = pfllib / "dataset" / "FashionMNIST"
    if (folder / "config.json").exists():
        return
    raw = folder / "rawdata"
    raw.mkdir(parents=True, exist_ok=True)
    if not (raw / "FashionMNIST").exists():
        (raw / "FashionMNIST").symlink_to((data_root / "FashionMNIST").resolve())
    subprocess.run([sys.executable, __file__, "--inside", "generate_FashionMNIST.py", "noniid", "-", "pat"],
                   cwd=pfllib / "dataset", check=True)


def round_seconds(pfllib: Path, algo: str, rounds: int) -> list[float]:
    """PFLlib's per-round wall times of `algo` on the workload, round 0 (which evaluates) included."""
    args = ["-data", "FashionMNIST", "-m", "DNN", "-algo", algo, "-gr", str(rounds), "-dev", "cpu", "-nc", "20",
            "-lbs", "10", "-lr", "0.01", "-ls", "1", "-jr", "1", "-eg", str(rounds + 1000)]
    out = subprocess.run([sys.executable, __file__, "--inside", "main.py", *args], cwd=pfllib / "system",
                         capture_output=True, text=True)
    seconds = [float(m.group(1)) for line in out.stdout.splitlines() if (m := ROUND_LINE.match(line))]
    if len(seconds) < 2:
        sys.exit(f"PFLlib {algo} printed no round times (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return seconds


def median_round(pfllib: Path, algo: str, rounds: int = TIMED_ROUNDS) -> tuple[float, list[float], float]:
    """The median of PFLlib's `rounds` timed rounds of `algo` (the rounds after round 0, which
    evaluates), those rounds, and round 0's time."""
    seconds = round_seconds(pfllib, algo, rounds)
    return statistics.median(seconds[1:]), seconds[1:], seconds[0]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--inside":
        run_inside(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pfllib", type=Path, required=True, help="a PFLlib checkout")
    parser.add_argument("--algo", nargs="+", default=["FedAvg", "FedProto"])
    parser.add_argument("--rounds", type=int, default=TIMED_ROUNDS, help="timed rounds after round 0")
    opts = parser.parse_args()
    data_root = os.environ.get("AUTOFL_DATA_ROOT")
    if not data_root:
        sys.exit("set AUTOFL_DATA_ROOT to the folder holding FashionMNIST/raw")
    generate(opts.pfllib, Path(data_root))
    for algo in opts.algo:
        median, timed, first = median_round(opts.pfllib, algo, opts.rounds)
        print(f"pfllib {algo:10s} round_s {median:7.3f}  rounds {' '.join(f'{s:.2f}' for s in timed)}"
              f"  (round 0, which evaluates: {first:.2f})", flush=True)


if __name__ == "__main__":
    main()

"""How much a search adds around its trials: wall time against summed trial time, and checkpoints.

    python scripts/search_overhead.py [--space FILE] [--trials 2] [--set KEY=VALUE ...]

Runs a throw-away study (in a temporary folder) and prints: the whole command's wall time, the trials'
summed training time (Tune's `time_total_s`: the rounds and their evaluation), the command's overhead
over that training as a percentage when trials ran one at a time, the size of the checkpoints
written, and the study's throughput: trials and FL rounds per hour of Tune's wall time (what a long
study on this machine finishes; pruned trials count as trials) and of the whole command. Without
--space it uses the FedFCD Table-1 scenario with fedavg for 40 rounds, no ASHA, one trial at a time
on 2 CPUs (trials of 30-40 s here), needing Fashion-MNIST in $AUTOFL_DATA_ROOT. `--set` overrides
keys of the space (dotted, e.g. base.fl.rounds=20).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autofl.config import apply_overrides

DEFAULT_SPACE = {
    "study": "overhead",
    "base": {"data": {"dataset": "fmnist", "pool": "train+test", "num_clients": 20,
                      "partition": {"kind": "pathological", "classes_per_client": 2},
                      "split": {"train": 0.75, "val": 0.05, "test": 0.2}},
             "model": {"arch": "mlp"},
             "fl": {"rounds": 40, "batch_size": 10, "lr": 0.01, "momentum": 0.0, "eval_every": 5},
             "method": {"name": "fedavg"}},
    "params": {"fl.lr": {"type": "float", "low": 0.005, "high": 0.05, "log": True}},
    "trials": 2,
    "scheduler": {"kind": "none"},
    "resources": {"cpu": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", help="a search-space file (default: the Table-1 scenario above)")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    space = apply_overrides(yaml.safe_load(Path(args.space).read_text()) if args.space else DEFAULT_SPACE, args.set)
    if args.trials:
        space["trials"] = args.trials
    home = Path(tempfile.mkdtemp(prefix="autofl-overhead-"))
    try:
        space_file = home / "space.yaml"
        space_file.write_text(yaml.safe_dump(space))
        cmd = [sys.executable, "-m", "autofl.cli", "search", "--space", str(space_file), "--dir", str(home / "studies")]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        run_dir = home / "studies" / space["study"] / "tune" / "run-1"
        trial_dirs = [p for p in run_dir.iterdir() if p.is_dir()]
        trained = 0.0
        rounds = 0
        for trial in trial_dirs:
            results = [json.loads(line) for line in (trial / "result.json").read_text().splitlines() if line]
            trained += results[-1]["time_total_s"]
            rounds += int(results[-1]["round"])
        ckpts = [c for t in trial_dirs for c in t.glob("checkpoint_*")]
        ckpt_bytes = sum(f.stat().st_size for c in ckpts for f in c.rglob("*") if f.is_file())
        print(f"trials {len(trial_dirs)}, rounds {rounds}, summed trial time {trained:.1f} s")
        print(f"wall (whole command) {wall:.1f} s")
        import autofl

        runs = autofl.load_study(space["study"], home / "studies").runs  # the study's record (its ledger)
        tune_wall = sum(run.get("tune_wall_s", 0.0) for run in runs)
        print(f"Tune experiment wall (Tuner.fit: actor start, trials, checkpoints, clean-up) {tune_wall:.1f} s")
        serial = space.get("resources", {}).get("cpu", 1) >= 2
        if serial:
            print(f"Tune's overhead over training {100 * (tune_wall - trained) / trained:.1f}% "
                  f"(trials ran one at a time)")
            print(f"overhead of the whole command over training {100 * (wall - trained) / trained:.1f}% "
                  f"(adds Python imports, Ray start and stop: {wall - tune_wall:.1f} s once per command)")
        print(f"throughput: {3600 * len(trial_dirs) / tune_wall:.0f} trials/hour, {3600 * rounds / tune_wall:.0f} "
              f"rounds/hour of Tune wall; {3600 * len(trial_dirs) / wall:.0f} trials/hour of the whole command")
        print(f"checkpoints {len(ckpts)}, {ckpt_bytes / 1e6:.2f} MB in all, "
              f"{ckpt_bytes / max(len(ckpts), 1) / 1e6:.2f} MB each")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

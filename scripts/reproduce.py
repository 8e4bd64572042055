"""Reproduce a paper table's rows on the paper's own setting and print ours beside the paper's.

    AUTOFL_DATA_ROOT=... python scripts/reproduce.py fedfcd-t1-fmnist-pat [--rounds 60] [--seeds 0 1 2]
                                                [--methods fedfcd] [--set fl.participation=0.4 ...]
    python scripts/reproduce.py --list

Each preset is a paper table's scenario (dataset, partition, clients, split, rounds, optimizer
settings) and the methods of its rows, each with its own defaults (`autofl/methods/`). Printed per
method: the paper's value, ours as best-over-rounds and final personal test accuracy (mean ± std
over seeds), rounds and seconds per round. Tables that report the best accuracy over rounds
(FedFCD's) compare with "best", tables of final accuracy (FDCL's) with "final".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from compare_methods import run_one  # scripts/ is on the path when this file runs

from autofl.config import apply_overrides
from autofl.data.datasets import load_raw_dataset
from autofl.errors import AutoFLError
from autofl.experiment import build_experiment
from autofl.tuning.strategy.space import experiment_dict


@dataclass
class Preset:
    source: str  # the paper table and column
    compare: str  # "best" or "final": what the paper's numbers are
    base: dict[str, Any]
    paper: dict[str, float]  # method -> the paper's value (percent)
    extra: list[str] = field(default_factory=list)  # methods run without a paper value (e.g. a simpler kin)
    metric: str = "personal_test_acc"  # what the table reports (global_test_acc: the global model, official test set)
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> its own settings (config overlay)
    note: str = ""  # what the paper does not give, and what stands in for it


# FedFCD Table 1 follows PFLlib's protocol: train+test pooled, then partitioned; 20 clients, all
# sampled; each client's data split 0.75 / 0.25; pathological(2) gives client i the classes of the
# pair {0,1}, {2,3}, ... in label order; batch 10, lr 0.01, no momentum, E=1; 500 rounds in the paper
_FEDFCD_FMNIST = {
    "data": {"dataset": "fmnist", "pool": "train+test", "num_clients": 20,
             "split": {"train": 0.75, "val": 0.0, "test": 0.25}},
    "model": {"arch": "mlp"},
    "fl": {"rounds": 60, "participation": 1.0, "local_epochs": 1, "batch_size": 10, "lr": 0.01, "momentum": 0.0},
}

# FedFCD's baselines ran as PFLlib implements them: FedProto's distance is nn.MSELoss (the squared
# distance divided by the feature width); FedGH at its defaults (server lr 0.01, 1 server epoch)
_PFLLIB_BASELINES = {"fedproto": {"method": {"distance": "mse"}}}

# FedECCR's and FedSiam-DA's CIFAR-10 partition: 10 clients, Dirichlet 0.5
_CIFAR10_DIR05 = {"dataset": "cifar10", "num_clients": 10, "partition": {"kind": "dirichlet", "alpha": 0.5}}

PRESETS: dict[str, Preset] = {
    "fedfcd-t1-fmnist-pat": Preset(
        "FedFCD Table 1, Fashion-MNIST, Pat (best average test accuracy)", "best",
        {**_FEDFCD_FMNIST, "data": {**_FEDFCD_FMNIST["data"], "partition": {
            "kind": "pathological", "classes_per_client": 2, "class_order": "in_order"}}},
        {"fedavg": 78.44, "fedprox": 80.33, "fedproto": 99.16, "fedgh": 99.22, "fedfcd": 99.17}, extra=["fedper"],
        methods=_PFLLIB_BASELINES),
    "fedfcd-t1-fmnist-dir": Preset(
        "FedFCD Table 1, Fashion-MNIST, Dirichlet beta=0.1 (best average test accuracy)", "best",
        {**_FEDFCD_FMNIST, "data": {**_FEDFCD_FMNIST["data"], "partition": {"kind": "dirichlet", "alpha": 0.1},
                                    "min_size": 1}},
        {"fedavg": 84.56, "fedprox": 83.19, "fedproto": 96.52, "fedgh": 96.58, "fedfcd": 96.57}, extra=["fedper"],
        methods=_PFLLIB_BASELINES),
    # FDCL Table 1 (FLGo's MOON base): cnn, Dirichlet 0.1, 20 clients at 50%, E=5, batch 32,
    # lr 0.01 with decay 0.999, momentum 0 (FLGo's default), final accuracy after 100 rounds; Ditto as
    # FLGo's (lambda 1, the personal model stepped with the global one on the same batches). The
    # paper does not state its local split; autofl's choice: the official train set partitioned,
    # each client's part split 0.8 / 0.2, the official test set unused by personal metrics
    "fdcl-t1-fmnist": Preset(
        "FDCL Table 1, FMNIST, alpha=0.1 (final accuracy after 100 rounds)", "final",
        {"data": {"dataset": "fmnist", "num_clients": 20, "partition": {"kind": "dirichlet", "alpha": 0.1},
                  "split": {"train": 0.8, "val": 0.0, "test": 0.2}},
         "model": {"arch": "cnn"},
         "fl": {"rounds": 100, "participation": 0.5, "local_epochs": 5, "batch_size": 32, "lr": 0.01,
                "lr_decay": 0.999, "momentum": 0.0}},
        {"fedavg": 78.95, "ditto": 76.19, "fedper": 78.90, "moon": 77.57, "fdcl": 79.27},
        methods={"ditto": {"method": {"lam": 1.0}}}),
    # FedECCR Table 1 (sec. 4.1): 10 clients, Dirichlet 0.5, 100 rounds, E=10, lr 0.01, batch 64, MOON's
    # CNN (2 conv, 5 FC); its baselines are MOON's, and so is the protocol: each client trains on its
    # whole part of the official train set, the global model is tested on the official test set. Not
    # stated, taken from MOON's code (whose CNN and baselines it uses): momentum 0.9, weight decay 1e-5,
    # FedProx mu 0.01 and MOON mu 5 (MOON's best on CIFAR-10). The classifier correction's SGD has no
    # momentum (FL-bench's CCVR), whatever the clients'
    "fedeccr-t1-cifar10": Preset(
        "FedECCR Table 1, CIFAR-10 (test accuracy of the global model)", "final",
        {"data": {**_CIFAR10_DIR05, "split": {"train": 1.0, "val": 0.0, "test": 0.0}},
         "model": {"arch": "moon_cnn"},
         "fl": {"rounds": 100, "participation": 1.0, "local_epochs": 10, "batch_size": 64, "lr": 0.01,
                "momentum": 0.9, "weight_decay": 1e-5}},
        {"fedavg": 67.13, "fedprox": 68.12, "moon": 69.18, "fedeccr": 70.89}, metric="global_test_acc",
        methods={"fedprox": {"method": {"mu": 0.01}}, "moon": {"method": {"mu": 5.0}}}),
    # FedSiam-DA (sec. IV-A): CIFAR-10, Dirichlet 0.5, 10 clients, 100 rounds, E=5, batch 64, lr 0.1,
    # momentum 0.9, weight decay 1e-5; mu 0.1 (FedSiam-DA), 1 (MOON), 0.01 (FedProx). ResNet-50 in the
    # paper; autofl's resnet18 (CIFAR stem) stands in. The split of each client's data is not stated:
    # 0.8 / 0.2. DualFed's paper has no CIFAR-10 setting (PACS, Office-Home, DomainNet, none of them in
    # torchvision): it runs on this partition with its own optimizer (official code: lr 0.01, momentum
    # 0.5, E=1, batch 256)
    "fedsiam-da-cifar10": Preset(
        "FedSiam-DA, CIFAR-10, Dirichlet beta=0.5 (personal test accuracy)", "final",
        {"data": {**_CIFAR10_DIR05, "split": {"train": 0.8, "val": 0.0, "test": 0.2}},
         "model": {"arch": "resnet18"},
         "fl": {"rounds": 100, "participation": 1.0, "local_epochs": 5, "batch_size": 64, "lr": 0.1,
                "momentum": 0.9, "weight_decay": 1e-5}},
        {}, extra=["fedavg", "fedprox", "moon", "fedsiam_da", "dualfed"],
        methods={"fedprox": {"method": {"mu": 0.01}}, "moon": {"method": {"mu": 1.0}, "model": {"projector_depth": 2}},
                 "fedsiam_da": {"method": {"mu": 0.1}},
                 "dualfed": {"fl": {"local_epochs": 1, "batch_size": 256, "lr": 0.01, "momentum": 0.5,
                                    "weight_decay": 0.0}}},
        note="the paper gives this setting's accuracies in figures only (no numbers to print); DualFed's "
             "paper has no CIFAR-10 setting"),
}


def method_config(preset: Preset, method: str, rounds: int | None = None) -> dict[str, Any]:
    """The preset's scenario with `method`'s own settings (and `rounds` when given)."""
    cfg = experiment_dict(preset.base, {"method.name": method}, preset.methods)
    if rounds:
        cfg["fl"]["rounds"] = rounds
    return cfg


def finished_runs(path: Path, configs: dict[str, dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs `path` holds (one JSON object a line, as `--rows` appends them) whose config is the one
    this invocation would train for their method: (method, seed) -> run. A run of another config (other
    rounds, another --set) is not reused; a last line cut off by a kill is skipped."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    wanted = json.loads(json.dumps(configs))  # as a line holds them (tuples as lists)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            run = json.loads(line)
        except json.JSONDecodeError:
            continue
        if wanted.get(run["method"]) == run["config"]:
            out[(run["method"], run["seed"])] = run
    return out


def _stat(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * std:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", choices=sorted(PRESETS))
    parser.add_argument("--list", action="store_true", help="list the presets")
    parser.add_argument("--rounds", type=int, help="override the preset's rounds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", help="a subset of the preset's rows")
    parser.add_argument("--download", action="store_true", help="let torchvision download the dataset")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change the setting for every row (a variant of the paper's), e.g. fl.participation=0.4")
    parser.add_argument("--rows", type=Path, metavar="FILE.jsonl",
                        help="append each finished (method, seed) run to this file and reuse the runs already in it; "
                        "a run in progress is saved every 10 rounds beside it (FILE-METHOD-SEED-CONFIGHASH.pt): a killed "
                        "reproduction run again with the same file continues where it was")
    parser.add_argument("--progress", type=int, default=0, metavar="N",
                        help="print each run's accuracy and seconds per round every N evaluated rounds")
    args = parser.parse_args(argv)
    if args.list or args.name is None:
        for name, p in PRESETS.items():
            print(f"{name}: {p.source}; rows {', '.join([*p.paper, *p.extra])}")
        return 0
    preset = PRESETS[args.name]
    methods = args.methods or [*preset.paper, *preset.extra]
    try:
        configs = {m: apply_overrides(method_config(preset, m, args.rounds), args.set) for m in methods}
        for cfg in configs.values():
            cfg["data"]["download"] = args.download
            build_experiment(cfg)  # every row's config is valid before any trains
        raw = load_raw_dataset(build_experiment(configs[methods[0]]).data)  # the methods share the scenario's data
    except AutoFLError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.name}: {preset.source}; {configs[methods[0]]['fl']['rounds']} rounds, seeds {args.seeds}")
    if preset.note:
        print(f"note: {preset.note}")
    print(f"{'method':<10} {'paper':>7} {'ours best':>15} {'ours final':>15} {'s/round':>8}")
    done = finished_runs(args.rows, configs) if args.rows else {}
    for method in methods:
        curves = []
        for seed in args.seeds:
            run = done.get((method, seed))
            if run is None:
                tag = hashlib.sha256(json.dumps(configs[method], sort_keys=True).encode()).hexdigest()[:10]
                ckpt = args.rows.with_name(f"{args.rows.stem}-{method}-{seed}-{tag}.pt") if args.rows else None
                run = run_one(configs[method], method, seed, raw, args.progress, ckpt)
                if args.rows:
                    with args.rows.open("a") as rows:
                        rows.write(json.dumps({"config": configs[method], **run}) + "\n")
                if ckpt is not None:  # the finished run is kept: its checkpoint is no longer needed
                    ckpt.unlink(missing_ok=True)
            curves.append(([h[preset.metric] for h in run["history"]], run["seconds_per_round"]))
        paper = preset.paper.get(method)
        print(f"{method:<10} {('-' if paper is None else f'{paper:.2f}'):>7} "
              f"{_stat([max(c) for c, _ in curves]):>15} {_stat([c[-1] for c, _ in curves]):>15} "
              f"{statistics.mean(s for _, s in curves):>8.2f}", flush=True)
    print(f"({preset.metric}; the paper's values are its {preset.compare} accuracy: compare them with ours "
          f"{preset.compare})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The keys of a round's metrics (spec §1), without torch: the search side (objectives, ledger,
status) names them, and read-only commands must not import torch to do so."""

# what the run cost so far (autofl.engine.cost): bytes (cumulative, and their mean per round done),
# training FLOPs (the same two), and the first evaluated round that reached eval.target_acc
COST_KEYS = (
    "upload_bytes",
    "download_bytes",
    "upload_bytes_per_round",
    "download_bytes_per_round",
    "train_flops",
    "flops_per_round",
    "rounds_to_target",
)

# validation accuracies with a smoothed twin `<metric>_last3` (autofl.engine.smoothing): the mean over the
# run's last 3 evaluated rounds, an objective less moved by one round's noise
SMOOTHING_ROUNDS = 3
SMOOTHED_BASES = ("personal_val_acc", "personal_val_acc_p10", "unseen_val_acc", "global_val_acc")


def smoothed_key(base: str, rounds: int = SMOOTHING_ROUNDS) -> str:
    return f"{base}_last{rounds}"


SMOOTHED_KEYS = tuple(smoothed_key(b) for b in SMOOTHED_BASES)

METRIC_KEYS = (
    "round",
    "personal_val_acc",
    "personal_val_acc_unweighted",
    "personal_val_acc_std",
    "personal_val_acc_p10",
    "personal_test_acc",
    "personal_test_acc_unweighted",
    "personal_test_acc_std",
    "personal_test_acc_p10",
    "global_val_acc",
    "global_test_acc",
    # data.holdout_clients: the held-out clients personalized as newcomers (autofl.engine.newcomers),
    # and participation_gap = personal_test_acc - unseen_test_acc
    "unseen_val_acc",
    "unseen_test_acc",
    "participation_gap",
    # eval.harmed_clients: the share of clients below their local-only / FedAvg-global accuracy (autofl.engine.harm)
    "harmed_frac",
    "harmed_vs_global",
    "train_loss",
    *SMOOTHED_KEYS,
    *COST_KEYS,
)

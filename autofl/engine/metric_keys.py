"""The keys of a round's metrics (spec §1), without torch: the search side (objectives, ledger,
status) names them, and read-only commands must not import torch to do so."""

METRIC_KEYS = (
    "round",
    "personal_val_acc",
    "personal_val_acc_std",
    "personal_val_acc_p10",
    "personal_test_acc",
    "personal_test_acc_std",
    "personal_test_acc_p10",
    "global_val_acc",
    "global_test_acc",
    "train_loss",
)

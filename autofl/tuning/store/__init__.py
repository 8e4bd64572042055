"""A study and its store: the study folder (`study`), its Optuna storage (`storage`), the ledger that
owns every trial state (`ledger`), the one-driver lock (`driver_lock`) and what a failed write
leaves (`write_failure`)."""

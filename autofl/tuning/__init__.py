"""The tuning side, by concern: `store` (a study's folder, its Optuna storage and the ledger, the
one owner of trial states), `strategy` (the space and how it is searched, no Ray), `tune` (the Ray
Tune adapter: experiments, trainable, searcher, scheduler, live view) and `reeval` (re-evaluation
over fresh seeds). Its public face is `autofl.search(...)` and `autofl.Study` (autofl/api.py)."""

"""The tuning side: study folders, the study ledger (the one owner of trial states), the Ray Tune
run (searcher, scheduler, trainable), re-evaluation and the live view. Its public face is
`autofl.search(...)` and `autofl.Study` (autofl/api.py)."""

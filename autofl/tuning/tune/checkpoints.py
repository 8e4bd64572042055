"""How many checkpoints a study's trials keep."""

from __future__ import annotations

from autofl.tuning.strategy.space import SearchSpace
from autofl.tuning.tune.ray_start import snapshot_seconds


def checkpoints_to_keep(space: SearchSpace) -> int | None:
    """How many checkpoints each trial keeps (None: all). A resumed run restores every trial from
    the checkpoint named in Tune's last experiment snapshot, written at most every
    TUNE_GLOBAL_CHECKPOINT_S; keeping 2 deletes older ones as new ones come, so checkpoints closer
    together than the snapshot (checkpoint_every_s: 0 saves every round) could delete the one the
    snapshot names before a kill, and the resumed trial then failed ("does not exist on storage
    anymore"; seen once in CI's two-node test). Such trials keep all theirs; the default (30 s) keeps 2."""
    return None if space.checkpoint_every_s < 2 * snapshot_seconds() else 2

"""Seed streams: the engine's are numbered (`SeedPurpose`, which names no method); a method names its
own by a string (`ServerContext.generator("...")`), reproducibly, apart from every numbered stream."""

from __future__ import annotations

import pytest
import torch

from autofl.engine.server import ServerContext
from autofl.seeding import SeedPurpose, derived_seed, named_stream


def context(seed: int, rnd: int) -> ServerContext:
    return ServerContext(round=rnd, completed=rnd, rounds=3, evaluated=False, seed=seed, global_state={},
                         state=None, data=None, model=None, device=torch.device("cpu"))  # type: ignore[arg-type]


def draws(gen: torch.Generator) -> list[int]:
    return torch.randint(0, 2**31, (4,), generator=gen).tolist()


def test_the_core_seed_enum_names_only_the_engines_streams():
    assert {p.name for p in SeedPurpose} == {
        "PARTITION", "CLIENT_SAMPLING", "ROUND_TORCH", "CLIENT_BATCHES", "HOLDOUT", "NEWCOMER_BATCHES"}


def test_a_named_stream_is_reproducible_and_apart_from_other_streams():
    ctx = context(7, 1)
    head = draws(ctx.generator("global_head"))
    assert head == draws(context(7, 1).generator("global_head"))  # the same on every run
    assert head != draws(ctx.generator("calibration"))  # another name, other draws
    assert head != draws(context(8, 1).generator("global_head"))  # another seed
    assert head != draws(ctx.generator("global_head", rnd=2))  # another round
    assert draws(ctx.generator("global_head", rnd=1)) == head
    for purpose in SeedPurpose:  # never a numbered stream's draws
        assert head != draws(torch.Generator().manual_seed(derived_seed(7, 1, purpose)))
    # a number names the stream it always did (the built-ins' kept streams: their runs reproduce)
    assert draws(ctx.generator(0xF6E)) == draws(torch.Generator().manual_seed(derived_seed(7, 1, 0xF6E)))
    assert named_stream("global_head") == named_stream("global_head")
    with pytest.raises(ValueError, match="must not be empty"):
        named_stream("")

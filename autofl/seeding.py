"""Seeds derived from (seed, round, client, purpose): every random draw is reproducible and restorable.

Each stream of random draws has its own purpose, mixed into the seed so that two streams never
share draws: the engine's are the constants of `SeedPurpose`; a method names its own streams by
strings (`ServerContext.generator("global_head")`), which `named_stream` turns into seed parts that no
numbered stream shares. The values are part of the results: changing one changes every run's numbers.
"""

import hashlib
from enum import IntEnum

import numpy as np


class SeedPurpose(IntEnum):
    """What a derived seed is for (the last part of `derived_seed`'s parts)."""

    PARTITION = 0xDA7A  # the data partition and each client's train / val / test split
    CLIENT_SAMPLING = 0x5A3  # which clients a round samples
    ROUND_TORCH = 0x7011  # torch's global generator at the start of a round (dropout, init of spares)
    CLIENT_BATCHES = 0xB47  # a client's batch order in a round
    HOLDOUT = 0x401D  # which clients data.holdout_clients keeps out of training
    NEWCOMER_BATCHES = 0xE3C  # a held-out client's batch order when it is personalized at an evaluated round


# the part that marks a stream named by a string (`named_stream`): two parts where numbered streams have one
NAMED_STREAM = 0x5EED


def named_stream(name: str) -> tuple[int, int]:
    """The seed parts of the stream called `name`: a marker and the first 8 bytes of the name's SHA-256 (the
    same on every machine and Python, unlike `hash`)."""
    if not name:
        raise ValueError("a seed stream's name must not be empty")
    return NAMED_STREAM, int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def derived_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])

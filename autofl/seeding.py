"""Seeds derived from (seed, round, client, purpose): every random draw is reproducible and restorable.

Each stream of random draws has its own purpose, a constant of `SeedPurpose`, mixed into the seed
so that two streams never share draws. The values are part of the results: changing one changes
every run's numbers.
"""

from enum import IntEnum

import numpy as np


class SeedPurpose(IntEnum):
    """What a derived seed is for (the last part of `derived_seed`'s parts)."""

    PARTITION = 0xDA7A  # the data partition and each client's train / val / test split
    CLIENT_SAMPLING = 0x5A3  # which clients a round samples
    ROUND_TORCH = 0x7011  # torch's global generator at the start of a round (dropout, init of spares)
    CLIENT_BATCHES = 0xB47  # a client's batch order in a round
    FEDFCD_GLOBAL_HEAD = 0xFCD  # FedFCD: the server's batch order when it trains the global head
    FEDECCR_CALIBRATION = 0xCCF  # FedECCR: virtual features and batch order of the classifier correction
    FEDGH_GLOBAL_HEAD = 0xF6E  # FedGH: the server's batch order when it trains the global head


def derived_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])

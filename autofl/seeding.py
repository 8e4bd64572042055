"""Seeds derived from (seed, round, client, purpose): every random draw is reproducible and restorable."""

import numpy as np


def derived_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])

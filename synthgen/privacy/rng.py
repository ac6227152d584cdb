"""Host randomness for DP mechanisms.

Production code draws its seed from the operating system (`secrets`), so the noise of a
release cannot be replayed by anyone who knows the code. Fixed seeds exist for tests only.
"""

from __future__ import annotations

import secrets

import numpy as np


def secure_rng(seed: int | None = None) -> np.random.Generator:
    """Returns a numpy Generator seeded from OS entropy, or from `seed` in tests.

    Args:
      seed: fixed seed for reproducible tests; None (the default) uses 128 bits from
        `secrets`, as every production release must.

    Returns:
      A PCG64-backed `np.random.Generator`.
    """
    if seed is None:
        seed = secrets.randbits(128)
    return np.random.Generator(np.random.PCG64(seed))

"""An audit's randomness: independent streams of one audit seed, and the inclusion coins.

Every one-run audit (Steinke, Nasr & Jagielski 2023) draws its public canary material, its
coins (which canary is inserted) and the audited run's own seed from independent streams of
one seed (`streams`); each canary is inserted by a fair coin (`draw_coins`).

Privacy:
  The coins decide which canaries the audited run sees: they stay in memory (or in a
  private work folder), never in a result.
"""

from __future__ import annotations

import numpy as np

from synthgen import run_seed


def streams(seed: int | None) -> tuple[np.random.Generator, np.random.Generator, int]:
    """(canary-material rng, coin rng, training seed): independent streams of the audit seed.

    The audit seed is `seed` (tests) or 128 bits of OS entropy; the training seed is a
    128-bit integer for `DPConfig.seed` (the run's sampler and noise).
    """
    material, coins, training = np.random.SeedSequence(run_seed.shared_seed(seed)).spawn(3)
    words = training.generate_state(4, np.uint32).astype(object)
    train_seed = int(sum(int(w) << (32 * i) for i, w in enumerate(words)))
    return np.random.default_rng(material), np.random.default_rng(coins), train_seed


def draw_coins(rng: np.random.Generator, m: int) -> np.ndarray:
    """m independent fair coins (True: inserted). Secret: memory only."""
    coins = rng.random(m) < 0.5
    if coins.all() or not coins.any():
        raise RuntimeError("every canary fell on one side; draw again (probability 2^(1-m))")
    return coins

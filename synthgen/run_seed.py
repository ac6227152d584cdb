"""The secret seed of a DP training run: 128 bits, split into a sampler and a noise stream.

`SeedSequence(seed).spawn(2)` gives the sampler's PCG64 seed and the data of an ``rbg``
noise key (4 x uint32: a threefry key holds 64 bits). See docs/guides/privacy.md.

Privacy:
  Whoever knows the run seed, the noise key or the sampler state can replay the noise and
  subtract it from the release: they stay in memory and in the run's private work folder
  (`synthgen.work_folder`). With several processes, process 0's seed is broadcast, all 128
  bits, so every process draws the same batches and noise.

References: Salmon et al. 2011 (counter-based PRNGs); numpy `SeedSequence` (O'Neill 2015).
"""

from __future__ import annotations

import numbers
import secrets
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # jax is imported where a key is made: the configs that name a seed stay light
    import jax

SEED_BITS = 128
_WORDS = SEED_BITS // 32
KEY_IMPL = "rbg"  # key data: 4 x uint32 = 128 bits


def check_seed(seed: int) -> None:
    """Raises ValueError unless `seed` is an integer in [0, 2**128)."""
    if (
        not isinstance(seed, numbers.Integral)
        or isinstance(seed, bool)
        or not 0 <= int(seed) < 2**SEED_BITS
    ):
        raise ValueError(f"seed must be an integer in [0, 2**{SEED_BITS}), got {seed=}")


def to_words(seed: int) -> np.ndarray:
    """The 128-bit `seed` as 4 uint32 words, least significant first."""
    check_seed(seed)
    seed = int(seed)
    return np.array([(seed >> (32 * i)) & 0xFFFFFFFF for i in range(_WORDS)], np.uint32)


def from_words(words) -> int:
    """Inverse of `to_words`."""
    return sum(int(w) << (32 * i) for i, w in enumerate(np.asarray(words, np.uint32)))


def shared_seed(seed: int | None) -> int:
    """The run seed: `seed` (tests), else 128 bits of OS entropy; with several processes,
    process 0's value (all 128 bits broadcast), so every process runs the same mechanism."""
    if seed is None:
        seed = secrets.randbits(SEED_BITS)
    check_seed(seed)
    seed = int(seed)
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        seed = from_words(multihost_utils.broadcast_one_to_all(to_words(seed)))
    return seed


def split_streams(seed: int) -> tuple[int, np.ndarray]:
    """Independent 128-bit streams of `seed`: the batch sampler's PCG64 seed (an int for
    `secure_rng`) and the (4,) uint32 data of the noise key (for `noise_key`)."""
    check_seed(seed)
    sampler, noise = np.random.SeedSequence(int(seed)).spawn(2)
    return from_words(sampler.generate_state(_WORDS, np.uint32)), noise.generate_state(
        _WORDS, np.uint32
    )


def noise_key(key_data) -> jax.Array:
    """The typed ``rbg`` PRNG key of the noise stream from its (4,) uint32 data."""
    data = np.asarray(key_data, np.uint32)
    if data.shape != (_WORDS,):
        raise ValueError(f"noise key data must have shape ({_WORDS},), got {data.shape=}")
    import jax

    return jax.random.wrap_key_data(data, impl=KEY_IMPL)


def sampling_key(seed: int | None = None) -> jax.Array:
    """A 128-bit ``rbg`` key from `seed` (tests) or OS entropy, for sampling that is not a
    DP mechanism (e.g. decoding from a released DP model: post-processing)."""
    seed = secrets.randbits(SEED_BITS) if seed is None else seed
    check_seed(seed)
    return noise_key(np.random.SeedSequence(int(seed)).generate_state(_WORDS, np.uint32))

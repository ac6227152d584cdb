"""Batch sampling for DP-SGD that is exactly what the accountant assumes.

* ``poisson``: each example joins every step independently with probability q = B/n; the
  realised batch is cut into padded fixed-shape chunks of `physical_batch` rows with a 0/1
  mask (static shapes for jit, no example ever dropped).
* ``shuffle``: every step draws exactly B distinct examples (replace-one neighbours).

The sampler's randomness is part of the mechanism: 128 bits of OS entropy in production
(`synthgen.run_seed`), a seeded generator in tests. Its checkpointed state is secret (PCG64
steps backwards too) and lives in the run's private work folder only. Padded rows repeat
index 0 with mask 0: the clipping step gives them weight exactly 0 (`dp_train`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from synthgen.privacy import accounting


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Fixed-shape slice of one logical batch: example indices and a validity mask."""

    indices: np.ndarray  # int64 [physical_batch]; padded rows repeat index 0
    mask: np.ndarray  # float32 [physical_batch]; 1 for real examples


class BatchSampler:
    """Draws the logical batch of each DP-SGD step and cuts it into fixed-shape chunks.

    Args:
      num_examples: n, size of the private dataset.
      batch_size: expected (poisson) or exact (shuffle) logical batch size B.
      physical_batch: rows per jitted call; a multiple of the device count.
      sampling: "poisson" or "shuffle".
      rng: numpy Generator (`secure_rng()` in production).
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        physical_batch: int,
        sampling: accounting.Sampling,
        rng: np.random.Generator,
        rate: float | None = None,
    ) -> None:
        if rate is not None and (sampling != "poisson" or not 0 < rate <= 1):
            raise ValueError(f"a fixed rate needs Poisson sampling and 0 < rate <= 1, {rate=}")
        self._rate = rate
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples=}")
        if not 1 <= batch_size <= num_examples:
            raise ValueError(f"batch_size must be in [1, {num_examples}], got {batch_size=}")
        if physical_batch < 1:
            raise ValueError(f"physical_batch must be >= 1, got {physical_batch=}")
        if sampling not in accounting.SAMPLINGS:
            raise ValueError(f"sampling must be one of {accounting.SAMPLINGS}, got {sampling=}")
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.physical_batch = physical_batch
        self.sampling = sampling
        self.rng = rng

    @property
    def sampling_rate(self) -> float:
        """batch_size / num_examples, or the fixed Poisson rate given at construction."""
        return self._rate if self._rate is not None else self.batch_size / self.num_examples

    def sample(self) -> np.ndarray:
        """Indices of one logical batch (sorted)."""
        if self.sampling == "poisson":
            included = self.rng.random(self.num_examples) < self.sampling_rate
            return np.flatnonzero(included)
        return np.sort(self.rng.choice(self.num_examples, self.batch_size, replace=False))

    def chunks(self, indices: np.ndarray) -> Iterator[Chunk]:
        """Cuts a logical batch into padded chunks; an empty batch yields one all-masked chunk.

        The empty batch still goes through one (zero) gradient call so that the noisy update
        is applied every step, as the accountant assumes.
        """
        size = self.physical_batch
        for start in range(0, max(len(indices), 1), size):
            part = indices[start : start + size]
            mask = np.zeros(size, np.float32)
            mask[: len(part)] = 1.0
            padded = np.zeros(size, np.int64)
            padded[: len(part)] = part
            yield Chunk(padded, mask)

    def state(self) -> dict:
        """JSON-serialisable generator state, for checkpoints."""
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state

"""Splitting a long post-processing job into shards that separate processes or machines run.

A shard ``I/N`` (0 <= I < N) runs the I-th of N contiguous runs of whole generation
batches, with the unsharded job's shapes and per-batch keys: the shards' outputs joined in
order are the unsharded output, byte for byte (tested), on the same JAX version and device
kind (`platform`, checked by the merges). Any scheduler can fan them out.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise ValueError(f"a shard is I/N with 0 <= I < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """'2/8' -> Shard(2, 8)."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise ValueError(f"a shard is written I/N (e.g. 0/4), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def document_range(self, total: int, batch: int) -> tuple[int, int]:
        """[first, end) of this shard's documents: whole batches of `batch`, in order."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch=}")
        batches = -(-total // batch)
        first = self.index * batches // self.count
        end = (self.index + 1) * batches // self.count
        return min(first * batch, total), min(end * batch, total)


def platform() -> dict:
    """What the floats of a shard depend on beyond its inputs: merges require the same."""
    import jax

    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
    }

"""Which private examples a token's prompts see: pools and their Poisson subsets.

Privacy:
  Unit: one private example; add/remove-one. Each example joins the sample with probability
  exactly q and one uniformly random prompt, independently of the others, so adding one
  changes at most one of the M prompts. A pool smaller than the declared
  `public_pool_size` is refused, naming its (public) label, never its size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from synthgen.fewshot.config import FewShotConfig


def _pools(rows, targets, pool_field: str | None, declared: int) -> list[np.ndarray]:
    """The private row indices of each target's pool; refuses pools below `declared`.

    The refusal names the pool by its label (public: it comes from the targets) and says
    only that the pool is smaller than the declared size, never how large it is.
    """
    if pool_field is None:
        if len(rows) < declared:
            raise ValueError("the private dataset is smaller than the declared public pool size")
        everything = np.arange(len(rows))
        return [everything] * len(targets)
    by_value: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        by_value.setdefault(row[pool_field], []).append(i)
    arrays = {value: np.asarray(indices, np.int64) for value, indices in by_value.items()}
    pools = []  # one shared array per pool, so pools can be told apart by identity
    for target in targets:
        value = target[pool_field]
        pool = arrays.setdefault(value, np.zeros(0, np.int64))  # its own, even if empty
        if pool.size < declared:
            raise ValueError(
                f"the private pool of {pool_field}={value!r} is smaller than the declared "
                "public pool size"
            )
        pools.append(pool)
    return pools


def draw_subsets(
    pool: np.ndarray, config: FewShotConfig, rate: float, rng: np.random.Generator
) -> list[list[int]]:
    """Poisson-samples `pool` at `rate` and deals the sample to M prompts at random.

    Each example, whatever the pool's size, joins with probability exactly `rate` (the
    accountant's q) and a uniformly random prompt, which keeps at most `config.shots_cap`
    (smallest random priority first): adding one example changes at most one prompt.
    """
    # One row of uniforms per pool example (inclusion, prompt, priority), so an example's
    # fate is independent of the others': the coupling of the sensitivity argument.
    draws = rng.random((pool.size, 3))
    keep = draws[:, 0] < rate
    sampled, slots, priority = (
        pool[keep],
        (draws[keep, 1] * config.subsets).astype(int),
        draws[keep, 2],
    )
    subsets = []
    for j in range(config.subsets):
        members = np.flatnonzero(slots == j)
        order = members[np.argsort(priority[members])][: config.shots_cap]
        subsets.append(sampled[order].tolist())
    return subsets

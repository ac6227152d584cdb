"""The Gaussian sparse histogram: release the keys many units share, with noisy counts.

Each privacy unit (a document) contributes a set of at most `max_keys` distinct keys (its
keywords), +1 each. The mechanism adds N(0, sigma^2) to the count of every key present in
the data and releases the keys whose noisy count reaches a threshold tau, with their noisy
counts; keys absent from the data are never considered, so the key universe need not be
known in advance (invented words included).

Privacy:
  Unit: one document, add/remove-one. Keys present in both neighbours change by at most 1
  each, on at most `max_keys` keys: the Gaussian mechanism with L2 sensitivity
  sqrt(max_keys), i.e. noise multiplier sigma / sqrt(max_keys). A key only the larger
  neighbour holds has count 1 there and is released with probability at most
  Q((tau - 1) / sigma) (Q the standard normal tail); one document holds at most
  `max_keys` such keys, so with probability at most delta_t = max_keys * Q((tau - 1) / sigma)
  any of them is released. Conditioned on none being released the output is post-processing
  of the Gaussian mechanism on the shared keys, independent of the new keys' noise, so the
  release is bounded by the composition of that Gaussian mechanism with a (0, delta_t)-DP
  event, which is how the ledger records it (`sparse_histogram_event`).

References:
  Korolova, Kenthapadi, Mishra, Ntoulas 2009 (releasing search queries, thresholding);
  Gopi, Gulhane, Kulkarni, Shen, Shokouhi, Yekhanin 2020 (DP set union);
  Wilkins, Kifer, Zhang, Karrer 2024 (exact analysis of the Gaussian sparse histogram).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
from dp_accounting import dp_event
from scipy.stats import norm

from synthgen.privacy import accountants, events

MIN_NOISE_STD = 0.1  # the least noise the calibration tries (see plan_sparse_histogram)


@dataclasses.dataclass(frozen=True)
class SparseHistogramPlan:
    """Public parameters of one sparse histogram release and its guarantee.

    Attributes:
      max_keys: most keys one unit contributes (its L2 sensitivity is sqrt(max_keys)).
      noise_std: sigma, the std of every key's count noise.
      threshold: tau; a key is released when its noisy count is at least tau.
      threshold_delta: delta_t, the chance a key of one unit alone is released.
      epsilon: the release's epsilon at `delta`.
      delta: the release's delta (includes delta_t).
    """

    max_keys: int
    noise_std: float
    threshold: float
    threshold_delta: float
    epsilon: float
    delta: float

    @property
    def event(self) -> dp_event.DpEvent:
        return sparse_histogram_event(self.noise_std, self.max_keys, self.threshold_delta)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(
            mechanism="Gaussian sparse histogram with threshold (DP set union)",
            unit="one document",
            neighboring_relation="ADD_OR_REMOVE_ONE",
        )
        return out


def threshold_delta(noise_std: float, threshold: float, max_keys: int) -> float:
    """delta_t = max_keys * Q((tau - 1) / sigma): a unit's own keys released at all."""
    return float(max_keys * norm.sf((threshold - 1.0) / noise_std))


def sparse_histogram_event(
    noise_std: float, max_keys: int, delta_threshold: float
) -> dp_event.DpEvent:
    """The release's event: Gaussian(sigma / sqrt(max_keys)) composed with (0, delta_t)."""
    if max_keys < 1:
        raise ValueError(f"max_keys must be >= 1, got {max_keys=}")
    if not 0 <= delta_threshold < 1:
        raise ValueError(f"delta_threshold must be in [0, 1), got {delta_threshold=}")
    gaussian = events.gaussian_event(noise_std / math.sqrt(max_keys))
    if delta_threshold == 0:
        return gaussian
    return dp_event.ComposedDpEvent([gaussian, events.epsilon_delta_event(0.0, delta_threshold)])


def plan_sparse_histogram(epsilon: float, delta: float, max_keys: int) -> SparseHistogramPlan:
    """The least noise (and its threshold) making the release (epsilon, delta)-DP.

    Half of delta goes to the threshold (tau = 1 + sigma * Q^-1(delta / (2 max_keys))),
    half to the Gaussian part; sigma is the smallest (bisection, PLD) that meets epsilon.

    Raises:
      ValueError: a non-positive epsilon, delta outside (0, 1) or max_keys < 1.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    if not 0 < delta < 1 or max_keys < 1:
        raise ValueError(f"need 0 < delta < 1 and max_keys >= 1, got {delta=} {max_keys=}")
    delta_t = delta / 2
    z = norm.isf(delta_t / max_keys)

    def plan(sigma: float) -> SparseHistogramPlan:
        tau = 1.0 + sigma * z
        dt = threshold_delta(sigma, tau, max_keys)
        eps = accountants.epsilon(sparse_histogram_event(sigma, max_keys, dt), delta)
        return SparseHistogramPlan(max_keys, sigma, tau, dt, eps, delta)

    # Bracket [low, high] with plan(high) meeting epsilon and plan(low) not. Below
    # MIN_NOISE_STD the PLD grid explodes; a target reachable with less noise gets the floor
    # (more noise than needed, never less).
    high = 1.0
    if plan(high).epsilon <= epsilon:
        while high > MIN_NOISE_STD and plan(high / 2).epsilon <= epsilon:
            high /= 2
        low = high / 2
        if high <= MIN_NOISE_STD:
            return plan(high)
    else:
        low = high
        while plan(high).epsilon > epsilon:
            low, high = high, high * 2
            if high > 1e6:
                raise ValueError(f"no noise reaches {epsilon=} at {delta=}")
    while high - low > 1e-3 * high:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if plan(mid).epsilon <= epsilon else (mid, high)
    return plan(high)


def unit_keys(keys: Iterable[Hashable], max_keys: int) -> list[Hashable]:
    """A unit's distinct keys in order, at most `max_keys` (the contribution bound)."""
    return list(dict.fromkeys(keys))[:max_keys]


def gaussian_sparse_histogram(
    units: Sequence[Iterable[Hashable]],
    plan: SparseHistogramPlan,
    rng: np.random.Generator,
) -> dict[Hashable, float]:
    """The released keys and their noisy counts, by descending noisy count.

    Args:
      units: each unit's keys; only the first `plan.max_keys` distinct ones count.
      plan: from `plan_sparse_histogram`.
      rng: the mechanism's randomness (production: `secure_rng()`).

    Returns:
      {key: noisy count} of the keys whose noisy count reached the threshold.

    Privacy:
      (plan.epsilon, plan.delta)-DP for one unit under add/remove-one: see the module
      docstring. Nothing else about the counts is returned.
    """
    counts: Counter = Counter()
    for keys in units:
        counts.update(unit_keys(keys, plan.max_keys))
    keys = sorted(counts, key=str)  # a fixed order: the noise does not depend on hashing
    if not keys:
        return {}
    noisy = np.array([counts[k] for k in keys], np.float64) + rng.normal(
        0.0, plan.noise_std, len(keys)
    )
    released = [(k, float(c)) for k, c in zip(keys, noisy) if c >= plan.threshold]
    released.sort(key=lambda kc: (-kc[1], str(kc[0])))
    return dict(released)

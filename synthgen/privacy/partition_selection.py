"""DP partition selection with counts over an unknown domain, through PipelineDP.

Each privacy unit (a record) holds a set of keys (its keywords). `release_key_counts`
releases the keys that many units share, with noisy counts, and never a key that only a
few units hold: the DP partition selection of PipelineDP (Google's `pipeline-dp`, on its
local backend by default; the same `DPEngine` runs on Apache Beam or Spark when a collection
outgrows one machine). The selection and the count share one Gaussian noise draw
(``post_aggregation_thresholding``): the Gaussian sparse histogram (Wilkins et al. 2024).

The randomness is python-dp's own secure noise (OS entropy), not a `numpy` generator: a
release cannot be replayed from a seed, which is what a production release wants. Tests
check it statistically.

Privacy:
  Unit: one record, add/remove-one. A record contributes each of its keys at most once and
  at most `max_keys` keys (PipelineDP bounds both again: ``max_partitions_contributed``,
  ``max_contributions_per_partition = 1``), so the count vector has L2 sensitivity
  sqrt(max_keys). PipelineDP calibrates the Gaussian noise and the threshold so that the
  whole aggregation (which keys appear, and their counts) is (epsilon, delta)-DP
  (`NaiveBudgetAccountant` with one aggregation: the whole budget). The ledger records it as
  that (epsilon, delta) event. A key held by a single record is released with probability
  at most delta.

References:
  Google, PipelineDP (pipeline-dp.org) and python-dp; Gopi et al. 2020 (DP set union);
  Wilkins, Kifer, Zhang, Karrer 2024 (exact analysis of the Gaussian sparse histogram).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

from dp_accounting import dp_event

from synthgen.privacy import events

MECHANISM = "PipelineDP Gaussian count with post-aggregation thresholding (DP partition selection)"


@dataclasses.dataclass(frozen=True)
class KeyCountRelease:
    """The released keys with their noisy counts (descending) and the release's event."""

    counts: dict[Hashable, float]
    epsilon: float
    delta: float
    max_keys: int

    @property
    def event(self) -> dp_event.DpEvent:
        return events.epsilon_delta_event(self.epsilon, self.delta)

    def to_dict(self) -> dict:
        return {
            "mechanism": MECHANISM,
            "max_keys": self.max_keys,
            "l2_sensitivity": math.sqrt(self.max_keys),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "released_keys": len(self.counts),
            "unit": "one record",
            "neighboring_relation": "ADD_OR_REMOVE_ONE",
        }


def _strategy(epsilon: float, delta: float, max_keys: int):
    """python-dp's Gaussian thresholding strategy for one aggregation holding the whole
    (epsilon, delta): the one PipelineDP's post-aggregation thresholding runs."""
    import pipeline_dp
    from pipeline_dp import partition_selection

    return partition_selection.create_partition_selection_strategy(
        pipeline_dp.PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING, epsilon, delta, max_keys
    )


def selection_threshold(epsilon: float, delta: float, max_keys: int) -> float:
    """The noisy count a key needs to be released by `release_key_counts` (public)."""
    return float(_strategy(epsilon, delta, max_keys).threshold)


def noise_stddev(epsilon: float, delta: float, max_keys: int) -> float:
    """The standard deviation of the Gaussian noise on each released count (public): read
    off the threshold and the keep probability of a key one unit holds, P(1 + N(0, s^2) >=
    threshold), which is how python-dp's strategy draws it."""
    from scipy.stats import norm

    strategy = _strategy(epsilon, delta, max_keys)
    sigma = float((strategy.threshold - 1.0) / norm.isf(strategy.probability_of_keep(1)))
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(
            f"no usable noise at {epsilon=}, {delta=}: python-dp's threshold keeps a key one "
            "unit holds half the time; use a smaller epsilon"
        )
    return sigma


def keep_probability(count: int, epsilon: float, delta: float, max_keys: int) -> float:
    """The probability that a key held by `count` units is released (public arithmetic)."""
    return float(_strategy(epsilon, delta, max_keys).probability_of_keep(int(count)))


def release_key_counts(
    unit_keys: Sequence[Sequence[Hashable]],
    *,
    epsilon: float,
    delta: float,
    max_keys: int,
    backend=None,
) -> KeyCountRelease:
    """Releases the keys many units share, with Gaussian-noised counts.

    Args:
      unit_keys: one sequence of keys per privacy unit (duplicates count once; keys past
        the first `max_keys` distinct ones are dropped).
      epsilon: epsilon of the whole release.
      delta: delta of the whole release (selection included).
      max_keys: most keys one unit contributes (public).
      backend: a PipelineDP backend (default: `pipeline_dp.LocalBackend()`).

    Returns:
      The released keys by descending noisy count, and the (epsilon, delta) event.

    Raises:
      ValueError: epsilon not finite and positive, delta outside (0, 1), max_keys < 1.

    Privacy:
      (epsilon, delta)-DP for one unit under add/remove-one; see the module docstring.
    """
    import pipeline_dp

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    if max_keys < 1:
        raise ValueError(f"max_keys must be >= 1, got {max_keys=}")
    rows = [
        (unit, key)
        for unit, keys in enumerate(unit_keys)
        for key in list(dict.fromkeys(keys))[:max_keys]
    ]
    if not rows:  # what the mechanism outputs on such data (PipelineDP refuses empty input)
        return KeyCountRelease({}, epsilon, delta, max_keys)
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, backend or pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT],
        noise_kind=pipeline_dp.NoiseKind.GAUSSIAN,
        max_partitions_contributed=max_keys,
        max_contributions_per_partition=1,
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING,
        post_aggregation_thresholding=True,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda row: row[0],
        partition_extractor=lambda row: row[1],
        value_extractor=lambda row: 0,
    )
    result = engine.aggregate(rows, params, extractors)
    accountant.compute_budgets()
    pairs = [(key, float(metrics.privacy_id_count)) for key, metrics in result]
    pairs.sort(key=lambda kv: (-kv[1], str(kv[0])))
    return KeyCountRelease(dict(pairs), epsilon, delta, max_keys)

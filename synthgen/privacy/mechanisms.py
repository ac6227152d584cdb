"""Differentially private release mechanisms on the host (numpy).

Every function draws its noise from an explicit `np.random.Generator`; production callers
pass `secure_rng()` (OS entropy), tests pass a fixed seed. Each mechanism's accounting
counterpart lives in `synthgen.privacy.accounting` (`*_event` functions), so a caller
charges the ledger with exactly the mechanism it runs.

Conventions: `sensitivity` is the largest change of the released statistic between
neighbouring datasets (L2 for Gaussian, L1 for Laplace, L-infinity of the score vector for
selection mechanisms). `monotonic=True` asserts that, between neighbours, all scores move in
the same direction (counts under add/remove-one); it halves the noise of selections.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite positive number, got {name}={value!r}")


def _scores(scores: np.typing.ArrayLike) -> np.ndarray:
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape={array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("scores must be finite")
    return array


def gaussian_mechanism(
    value: np.typing.ArrayLike,
    *,
    sensitivity: float,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Adds N(0, (noise_multiplier * sensitivity)^2) noise to every coordinate.

    Args:
      value: the statistic to release (any shape).
      sensitivity: L2 sensitivity of `value` between neighbouring datasets.
      noise_multiplier: sigma; the noise standard deviation is sigma * sensitivity.
      rng: source of randomness.

    Returns:
      The noisy statistic, float64, same shape as `value`.

    Privacy:
      Gaussian mechanism with L2 sensitivity `sensitivity`; account with
      `accounting.gaussian_event(noise_multiplier)` (Dwork & Roth 2014, App. A;
      tight PLD in dp-accounting).
    """
    _check_positive(sensitivity=sensitivity, noise_multiplier=noise_multiplier)
    array = np.asarray(value, dtype=np.float64)
    return array + rng.normal(0.0, noise_multiplier * sensitivity, size=array.shape)


def laplace_mechanism(
    value: np.typing.ArrayLike,
    *,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Adds Laplace(sensitivity / epsilon) noise to every coordinate.

    Args:
      value: the statistic to release (any shape).
      sensitivity: L1 sensitivity of `value` between neighbouring datasets.
      epsilon: privacy parameter.
      rng: source of randomness.

    Returns:
      The noisy statistic, float64, same shape as `value`.

    Privacy:
      epsilon-DP, Laplace mechanism (Dwork, McSherry, Nissim & Smith 2006); account with
      `accounting.laplace_event(epsilon)`.
    """
    _check_positive(sensitivity=sensitivity, epsilon=epsilon)
    array = np.asarray(value, dtype=np.float64)
    return array + rng.laplace(0.0, sensitivity / epsilon, size=array.shape)


def exponential_mechanism(
    utilities: np.typing.ArrayLike,
    *,
    epsilon: float,
    sensitivity: float,
    rng: np.random.Generator,
    monotonic: bool = False,
    log_base_measure: np.typing.ArrayLike | None = None,
) -> int:
    """Selects index i with probability proportional to mu_i exp(epsilon u_i / (2 sensitivity)).

    Sampled with the Gumbel-max trick: argmax_i (log mu_i + epsilon * u_i / (2 * sensitivity)
    + G_i), G_i ~ Gumbel(0, 1) independently. With `monotonic=True` the factor 2 is dropped.
    The base measure mu is uniform unless `log_base_measure` gives log mu (finite, or -inf
    for a candidate that can never be drawn; at least one finite).

    Args:
      utilities: one utility per candidate (1-D, finite).
      epsilon: privacy parameter.
      sensitivity: L-infinity sensitivity of the utility vector.
      rng: source of randomness.
      monotonic: utilities all move in the same direction between neighbours.
      log_base_measure: log mu per candidate; must not depend on the private data.

    Returns:
      The selected index.

    Privacy:
      epsilon-DP and epsilon-bounded-range (McSherry & Talwar 2007; monotone case: Dwork &
      Roth 2014, Thm 3.10; bounded range: Dong, Durfee & Rogers 2020). A base measure that
      does not depend on the private data leaves the guarantee unchanged: it multiplies a
      candidate's weight by the same factor in both neighbours, so the usual proof goes
      through as it is (McSherry & Talwar 2007 state the mechanism for any base measure).
      Account with `accounting.pure_epsilon_event(epsilon)`.
    """
    _check_positive(epsilon=epsilon, sensitivity=sensitivity)
    scores = _scores(utilities)
    factor = 1.0 if monotonic else 2.0
    logits = epsilon * scores / (factor * sensitivity)
    if log_base_measure is not None:
        base = np.asarray(log_base_measure, dtype=np.float64)
        if base.shape != scores.shape:
            raise ValueError(f"log_base_measure must match utilities: {base.shape=}")
        if np.any(np.isnan(base)) or np.any(base == np.inf) or not np.any(np.isfinite(base)):
            raise ValueError("log_base_measure must be finite or -inf, with a finite entry")
        logits = logits + base
    return int(np.argmax(logits + rng.gumbel(size=scores.shape)))


def report_noisy_max(
    scores: np.typing.ArrayLike,
    *,
    epsilon: float,
    sensitivity: float,
    rng: np.random.Generator,
    monotonic: bool = False,
) -> int:
    """Returns argmax_i (s_i + Laplace(b)), b = 2 * sensitivity / epsilon (or half if monotone).

    Args:
      scores: one score per candidate (1-D, finite).
      epsilon: privacy parameter.
      sensitivity: L-infinity sensitivity of the score vector.
      rng: source of randomness.
      monotonic: scores all move in the same direction between neighbours (counts).

    Returns:
      The index of the largest noisy score; only the index is released.

    Privacy:
      epsilon-DP, report-noisy-max with Laplace noise (Dwork & Roth 2014, Claim 3.9).
      Account with `accounting.pure_epsilon_event(epsilon)`.
    """
    _check_positive(epsilon=epsilon, sensitivity=sensitivity)
    array = _scores(scores)
    scale = (1.0 if monotonic else 2.0) * sensitivity / epsilon
    return int(np.argmax(array + rng.laplace(0.0, scale, size=array.shape)))


def limited_domain_top1(
    counts: np.typing.ArrayLike,
    *,
    epsilon: float,
    delta: float,
    max_candidates: int,
    max_contributions: int | None = None,
    rng: np.random.Generator,
) -> int | None:
    """Releases the index of a noisy top count among the true top `max_candidates`, or None.

    Durfee & Rogers' LimitedDomain with k = 1: keep the k_bar = `max_candidates` largest true
    counts, add Gumbel(1/epsilon) noise to each, and compare them with a noisy threshold
    h_(k_bar+1) + 1 + ln(min(max_contributions, k_bar) / delta) / epsilon + Gumbel(1/epsilon),
    where h_(k_bar+1) is the (k_bar+1)-th largest true count (0 if there are no more).
    Returns None (the paper's bottom symbol) when the threshold wins.

    Args:
      counts: non-negative counts over a candidate domain (1-D).
      epsilon: privacy parameter.
      delta: privacy parameter in (0, 1).
      max_candidates: k_bar >= 1, how many true top counts the mechanism may look at.
      max_contributions: how many distinct counts one individual can touch (l0 bound);
        None means unrestricted (k_bar is used).
      rng: source of randomness.

    Returns:
      An index into `counts`, or None.

    Privacy:
      (epsilon, delta)-DP for k = 1 under adding or removing one individual who changes
      at most `max_contributions` counts by at most 1 each (Durfee & Rogers 2019,
      "Practical DP top-k selection with pay-what-you-get composition", Alg. 1 / Thm. 1).
      Account with `accounting.epsilon_delta_event(epsilon, delta)`. Returning None still
      costs the charge.
    """
    _check_positive(epsilon=epsilon, delta=delta)
    if delta >= 1:
        raise ValueError(f"delta must be < 1, got {delta=}")
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates=}")
    l0 = max_candidates if max_contributions is None else max_contributions
    if l0 < 1:
        raise ValueError(f"max_contributions must be >= 1, got {max_contributions=}")
    array = _scores(counts)
    if np.any(array < 0):
        raise ValueError("counts must be non-negative")
    order = np.argsort(-array, kind="stable")
    top = order[:max_candidates]
    h_next = array[order[max_candidates]] if array.size > max_candidates else 0.0
    threshold = h_next + 1.0 + math.log(min(l0, max_candidates) / delta) / epsilon
    noisy_top = array[top] + rng.gumbel(0.0, 1.0 / epsilon, size=top.shape)
    noisy_threshold = threshold + rng.gumbel(0.0, 1.0 / epsilon)
    best = int(np.argmax(noisy_top))
    if noisy_top[best] > noisy_threshold:
        return int(top[best])
    return None


class AboveThreshold:
    """Sparse vector technique: report the first query whose noisy answer clears a threshold.

    One instance answers a stream of queries and halts after the first positive answer;
    further queries raise. Noise: the threshold gets Laplace(2 * sensitivity / epsilon)
    once; each query gets Laplace(4 * sensitivity / epsilon), or Laplace(2 * sensitivity /
    epsilon) when the queries are monotonic.

    Privacy:
      epsilon-DP for the whole stream up to and including the first positive answer
      (Dwork & Roth 2014, Alg. 1 / Thm. 3.23; monotone variant: Lyu, Su & Li 2017).
      Negative answers are free; charge `accounting.pure_epsilon_event(epsilon)` once,
      before the first query.
    """

    def __init__(
        self,
        threshold: float,
        *,
        epsilon: float,
        sensitivity: float,
        rng: np.random.Generator,
        monotonic: bool = False,
    ) -> None:
        _check_positive(epsilon=epsilon, sensitivity=sensitivity)
        if not math.isfinite(threshold):
            raise ValueError(f"threshold must be finite, got {threshold=}")
        self._rng = rng
        self._query_scale = (2.0 if monotonic else 4.0) * sensitivity / epsilon
        self._noisy_threshold = threshold + rng.laplace(0.0, 2.0 * sensitivity / epsilon)
        self._halted = False

    @property
    def halted(self) -> bool:
        """True once a query has been reported above the threshold."""
        return self._halted

    def test(self, answer: float) -> bool:
        """Returns whether the noisy `answer` clears the noisy threshold (then halts)."""
        if self._halted:
            raise RuntimeError("AboveThreshold has halted; start a new instance (new charge)")
        if not math.isfinite(answer):
            raise ValueError("query answers must be finite")
        above = answer + self._rng.laplace(0.0, self._query_scale) >= self._noisy_threshold
        self._halted = bool(above)
        return self._halted


def sparse_vector(
    answers: Iterable[float],
    threshold: float,
    *,
    epsilon: float,
    sensitivity: float,
    rng: np.random.Generator,
    monotonic: bool = False,
) -> int | None:
    """Returns the index of the first answer whose noisy value clears the threshold, or None.

    Args:
      answers: query answers in the order they are asked (may be a lazy iterable).
      threshold: public threshold.
      epsilon: privacy parameter.
      sensitivity: sensitivity of each query answer.
      rng: source of randomness.
      monotonic: the queries are monotonic.

    Returns:
      The index of the first positive answer, or None if no answer cleared the threshold.

    Privacy:
      epsilon-DP; see `AboveThreshold`.
    """
    svt = AboveThreshold(
        threshold, epsilon=epsilon, sensitivity=sensitivity, rng=rng, monotonic=monotonic
    )
    for index, answer in enumerate(answers):
        if svt.test(answer):
            return index
    return None

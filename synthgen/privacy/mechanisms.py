"""Differentially private release mechanisms on the host (numpy).

Every function draws its noise from an explicit `np.random.Generator`; production callers
pass `secure_rng()` (OS entropy), tests pass a fixed seed. Each mechanism's accounting
counterpart lives in `synthgen.privacy.events` (`*_event` functions), so a caller
charges the ledger with exactly the mechanism it runs.

Conventions: `sensitivity` is the largest change of the released statistic between
neighbouring datasets (L2 for Gaussian, L1 for Laplace, L-infinity of the score vector for
selection mechanisms). `monotonic=True` asserts that, between neighbours, all scores move in
the same direction (counts under add/remove-one); it halves the noise of selections.

Released noisy values never come from floating-point Laplace samples (`laplace_mechanism`;
see docs/guides/privacy.md, "Laplace on a grid").
"""

from __future__ import annotations

import math
from fractions import Fraction

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
      `events.gaussian_event(noise_multiplier)` (Dwork & Roth 2014, App. A;
      tight PLD in dp-accounting).
    """
    _check_positive(sensitivity=sensitivity, noise_multiplier=noise_multiplier)
    array = np.asarray(value, dtype=np.float64)
    return array + rng.normal(0.0, noise_multiplier * sensitivity, size=array.shape)


GRID_STEPS = 2**20
"""`laplace_grid` puts at least this many grid steps in each coordinate's share of the
sensitivity, so rounding to the grid adds at most a 2**-20 share of noise."""
_CLAMP_STEPS = 2**62  # |value| / granularity is clamped here, exactly representable


def laplace_grid(sensitivity: float, size: int) -> tuple[float, Fraction]:
    """The public grid of `laplace_mechanism` and the sensitivity it inflates for rounding.

    The granularity g is the largest power of two <= sensitivity / (size * 2**20): public
    (it depends on the sensitivity and the number of coordinates only), exact in floating
    point (dividing by it, and multiplying an integer by it, are exact), and fine: the
    noise scale is at least 2**20 * size / epsilon grid steps.

    Rounding each coordinate to the nearest multiple of g moves it by at most g / 2, so two
    values at L1 distance <= sensitivity round to grid points at L1 distance
    <= sensitivity + size * g: that is the sensitivity the noise is calibrated to.

    Args:
      sensitivity: L1 sensitivity of the statistic.
      size: number of coordinates of the statistic (>= 1).

    Returns:
      (granularity g, inflated sensitivity sensitivity + size * g as an exact fraction).

    Raises:
      ValueError: a non-positive sensitivity or size, or a grid outside the float range.
    """
    _check_positive(sensitivity=sensitivity)
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size=}")
    target = Fraction(sensitivity) / (int(size) * GRID_STEPS)
    exponent = target.numerator.bit_length() - target.denominator.bit_length()
    while Fraction(2) ** exponent > target:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= target:
        exponent += 1
    if not -1000 <= exponent <= 900:
        raise ValueError(f"sensitivity out of the supported range, got {sensitivity=}")
    granularity = math.ldexp(1.0, exponent)
    return granularity, Fraction(sensitivity) + int(size) * Fraction(granularity)


def laplace_mechanism(
    value: np.typing.ArrayLike,
    *,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Adds Laplace noise of scale ~sensitivity / epsilon, released on a public grid.

    Each coordinate is clamped to +-2**62 g and rounded to the nearest multiple of the
    public granularity g (`laplace_grid`), then moved by g * rint(L), L ~ Laplace(0, s) in
    grid units, s = sensitivity' / (epsilon * g), sensitivity' = sensitivity + size * g.
    rint(L) is drawn exactly with integer arithmetic (`_rounded_laplace`).

    Args:
      value: the statistic to release (any shape, finite).
      sensitivity: L1 sensitivity of `value` between neighbouring datasets.
      epsilon: privacy parameter.
      rng: source of randomness.

    Returns:
      The noisy statistic, float64, same shape as `value`; multiples of g.

    Raises:
      ValueError: non-positive sensitivity or epsilon, or a non-finite value.

    Privacy:
      epsilon-DP w.r.t. the relation for which `sensitivity` bounds the L1 change of
      `value`: the Laplace mechanism (Dwork, McSherry, Nissim & Smith 2006) of scale
      sensitivity' / epsilon on the rounded statistic g * rint(clamp(value) / g), whose L1
      sensitivity is <= sensitivity' (clamping is 1-Lipschitz, rounding moves each
      coordinate by <= g / 2), then rounded to the grid (post-processing: c + L rounds to
      c + rint(L) for c on the grid). Dominated by the continuous Laplace mechanism, also
      under PLD: account with `events.laplace_event(epsilon)`. Outputs are exact multiples
      of g with exactly sampled integer noise (Canonne, Kamath & Steinke 2020), closing
      Mironov's (2012) low-order-bits attack; the sampling time grows a little with the
      noise's magnitude. See docs/guides/privacy.md ("Laplace on a grid").
    """
    _check_positive(sensitivity=sensitivity, epsilon=epsilon)
    array = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError("value must be finite")
    if array.size == 0:
        return array.copy()
    granularity, inflated = laplace_grid(sensitivity, array.size)
    rate = Fraction(epsilon) * Fraction(granularity) / inflated  # 1 / scale, grid units
    bound = _CLAMP_STEPS * granularity
    centres = np.rint(np.clip(array, -bound, bound) / granularity)
    steps = [float(int(c) + _rounded_laplace(rate, rng)) for c in centres.ravel()]
    return np.asarray(steps, dtype=np.float64).reshape(array.shape) * granularity


def _uniform_below(n: int, rng: np.random.Generator) -> int:
    """A uniform integer in [0, n), exactly (numpy's unbiased integers, or rejection)."""
    if n < 2**63:
        return int(rng.integers(n))
    bits = n.bit_length()
    nbytes = (bits + 7) // 8
    while True:
        draw = int.from_bytes(rng.bytes(nbytes), "little") >> (8 * nbytes - bits)
        if draw < n:
            return draw


def _bernoulli(numerator: int, denominator: int, rng: np.random.Generator) -> bool:
    """Bernoulli(numerator / denominator), exactly."""
    return _uniform_below(denominator, rng) < numerator


def _bernoulli_exp_unit(numerator: int, denominator: int, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)), gamma = numerator / denominator in [0, 1] (CKS 2020, Alg. 1)."""
    k = 1
    while _bernoulli(numerator, denominator * k, rng):
        k += 1
    return k % 2 == 1


def _bernoulli_exp(gamma: Fraction, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for a rational gamma >= 0, exactly."""
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp_unit(1, 1, rng):
            return False
    rest = gamma - whole
    return _bernoulli_exp_unit(rest.numerator, rest.denominator, rng)


def _geometric(rate: Fraction, rng: np.random.Generator) -> int:
    """n >= 0 with P(n) = (1 - exp(-rate)) exp(-rate n), exactly (CKS 2020, Alg. 2).

    With rate = s / t: X = U + t V, U on {0, ..., t-1} with P(U = u) ~ exp(-u / t) (by
    rejection), V ~ Geometric(1 - exp(-1)), has P(X = x) ~ exp(-x / t); floor(X / s) then
    has P(n) ~ exp(-n s / t).
    """
    s, t = rate.numerator, rate.denominator
    while True:
        u = _uniform_below(t, rng)
        if _bernoulli_exp_unit(u, t, rng):
            break
    v = 0
    while _bernoulli_exp_unit(1, 1, rng):
        v += 1
    return (u + t * v) // s


def _rounded_laplace(rate: Fraction, rng: np.random.Generator) -> int:
    """rint(L), L ~ Laplace(0, 1 / rate): 0 w.p. 1 - exp(-rate / 2), else +-(1 + Geometric)."""
    if not _bernoulli_exp(rate / 2, rng):
        return 0
    magnitude = 1 + _geometric(rate, rng)
    return magnitude if _bernoulli(1, 2, rng) else -magnitude


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
      Account with `events.pure_epsilon_event(epsilon)`.
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

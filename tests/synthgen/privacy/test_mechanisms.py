"""Statistical tests of the mechanisms with fixed seeds (noise scales and selection laws)."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from synthgen.privacy import mechanisms as m
from synthgen.privacy.rng import secure_rng

N = 20_000


def _ks_accepts_only_true_scale(samples, dist, scale):
    """KS accepts the true scale and rejects 2/3 and 3/2 of it."""
    assert stats.kstest(samples, dist(scale=scale).cdf).pvalue > 0.01
    for wrong in (scale * 2 / 3, scale * 3 / 2):
        assert stats.kstest(samples, dist(scale=wrong).cdf).pvalue < 1e-6


def test_gaussian_scale():
    out = m.gaussian_mechanism(
        np.full(N, 5.0), sensitivity=2.0, noise_multiplier=1.5, rng=secure_rng(0)
    )
    _ks_accepts_only_true_scale(out - 5.0, stats.norm, 3.0)


def test_laplace_scale():
    # The grid is 2**-34 here and the inflated scale 4 (1 + 2**-20): continuous to KS.
    out = m.laplace_mechanism(np.zeros(N), sensitivity=2.0, epsilon=0.5, rng=secure_rng(1))
    _ks_accepts_only_true_scale(out, stats.laplace, 4.0)


LAPLACE_INPUTS = [
    np.array([7.0, 3.14159]),  # the DP-RAG score release: (count, sum of scores)
    np.array([0.1, 1 / 3, math.pi, -2.5e-9, 1e6 + 0.7]),
    np.full((3, 4), 0.1 + 0.2),
    np.float64(2**-40),
]


@pytest.mark.parametrize("value", LAPLACE_INPUTS)
@pytest.mark.parametrize(("sensitivity", "epsilon"), [(2.0, 0.3), (1.0, 0.1), (0.37, 5.0)])
def test_laplace_mechanism_releases_multiples_of_the_public_grid(value, sensitivity, epsilon):
    """Mironov 2012: float Laplace outputs carry their input in the low bits; grid ones not."""
    size = np.asarray(value).size
    g, inflated = m.laplace_grid(sensitivity, size)
    assert g == 2.0 ** math.floor(math.log2(g)) <= sensitivity / (size * 2**20) < 2 * g
    assert inflated == Fraction(sensitivity) + size * Fraction(g)
    for seed in range(3):
        out = m.laplace_mechanism(
            value, sensitivity=sensitivity, epsilon=epsilon, rng=secure_rng(seed)
        )
        assert out.dtype == np.float64 and out.shape == np.shape(value)
        steps = out / g
        np.testing.assert_array_equal(steps, np.round(steps))


def _rounded_laplace_pmf(j, scale):
    """P(rint(L) = j), L ~ Laplace(0, scale)."""
    j = np.abs(np.asarray(j, dtype=np.float64))
    inner = -np.expm1(-1 / (2 * scale))
    outer = np.exp(-(j - 0.5) / scale) * -np.expm1(-1 / scale) / 2
    return np.where(j == 0, inner, outer)


def _log_rounded_laplace_pmf(j, scale):
    j = np.abs(np.asarray(j, dtype=np.float64))
    inner = math.log(-math.expm1(-1 / (2 * scale)))
    outer = -(j - 0.5) / scale + math.log(-math.expm1(-1 / scale) / 2)
    return np.where(j == 0, inner, outer)


def _rounded_laplace(scale, *, size, rng):
    """rint(Laplace(scale)) draws of the exact sampler `laplace_mechanism` adds to the grid."""
    rate = 1 / Fraction(scale)
    return np.array([m._rounded_laplace(rate, rng) for _ in range(size)], np.int64)


def _chi2_rounded_laplace(draws, scale, cut=12):
    """Chi-square p-value of integer draws against rint(Laplace(scale)); tails pooled."""
    support = np.arange(-cut, cut + 1)
    probs = _rounded_laplace_pmf(support, scale)
    tail = (1 - probs.sum()) / 2
    probs = np.concatenate([[tail], probs, [tail]])
    counts = np.bincount(np.clip(draws, -cut - 1, cut + 1) + cut + 1, minlength=len(probs))
    return stats.chisquare(counts, probs * len(draws)).pvalue


def test_rounded_laplace_matches_its_pmf_and_only_its_scale():
    draws = _rounded_laplace(3.0, size=N, rng=secure_rng(6))
    assert draws.dtype == np.int64 and draws.shape == (N,)
    assert _chi2_rounded_laplace(draws, 3.0) > 0.01
    for wrong in (2.0, 4.5):  # 2/3 and 3/2 of the scale
        assert _chi2_rounded_laplace(draws, wrong) < 1e-6
    small = _rounded_laplace(Fraction(1, 3), size=N, rng=secure_rng(7))
    assert _chi2_rounded_laplace(small, 1 / 3) > 0.01


def test_laplace_mechanism_is_the_rounded_value_plus_rounded_laplace_steps():
    """The construction the neighbour test below reasons about, draw for draw."""
    value, sensitivity, epsilon = np.array([4.0, 0.61803]), 2.0, 0.7
    g, inflated = m.laplace_grid(sensitivity, value.size)
    out = m.laplace_mechanism(value, sensitivity=sensitivity, epsilon=epsilon, rng=secure_rng(8))
    scale = inflated / (Fraction(epsilon) * Fraction(g))
    steps = _rounded_laplace(scale, size=2, rng=secure_rng(8))
    np.testing.assert_array_equal(out, (np.rint(value / g) + steps) * g)
    # and its grid-unit scale is the inflated one, sensitivity' / (epsilon g)
    many = m.laplace_mechanism(
        np.zeros(N), sensitivity=sensitivity, epsilon=epsilon, rng=secure_rng(9)
    )
    g_many, inflated_many = m.laplace_grid(sensitivity, N)
    scale = inflated_many / (Fraction(epsilon) * Fraction(g_many))
    _ks_accepts_only_true_scale(many / g_many, stats.laplace, float(scale))


@pytest.mark.parametrize(("sensitivity", "epsilon"), [(2.0, 0.5), (1.0, 3.0), (0.3, 0.05)])
def test_neighbour_pmf_ratio_over_the_grid_is_at_most_exp_epsilon(sensitivity, epsilon):
    """Exact pmfs of the outputs of two neighbours with worst-case rounding: each coordinate
    sits just below a half step and moves just past the next one, so the rounded values
    move by sensitivity / g + size - 1 grid steps in L1; the ratio stays <= exp(epsilon)."""
    size = 2
    g, inflated = m.laplace_grid(sensitivity, size)
    scale = float(inflated / (Fraction(epsilon) * Fraction(g)))
    eta = 2.0**-10
    x = np.full(size, 0.5 - eta) * g
    total_steps = round(sensitivity / g)
    moves = np.array([total_steps // 2, total_steps - total_steps // 2 - 1]) + 2 * eta
    neighbour = x + moves * g
    assert np.abs(neighbour - x).sum() <= sensitivity
    c, c_n = np.rint(x / g), np.rint(neighbour / g)
    assert np.abs(c_n - c).sum() == total_steps + size - 1  # rounding added steps

    def worst_log_ratio(scale):
        total = 0.0
        for a, b in zip(c, c_n, strict=True):
            y = np.arange(min(a, b) - 5, max(a, b) + 6)
            diff = _log_rounded_laplace_pmf(y - a, scale) - _log_rounded_laplace_pmf(y - b, scale)
            total += np.abs(diff).max()
        return total

    assert worst_log_ratio(scale) <= epsilon * (1 + 1e-12)
    assert worst_log_ratio(scale) > epsilon * (1 - 1e-5)  # tight: the bound is not loose
    # without the inflation for rounding the same neighbours would break epsilon
    assert worst_log_ratio(sensitivity / (epsilon * g)) > epsilon * (1 + 1e-9)


def _chi2_matches(draws, probs):
    counts = np.bincount(draws, minlength=len(probs))
    return stats.chisquare(counts, np.asarray(probs) * len(draws)).pvalue


def _exponential_draws(utilities, eps, sens, rng, **options) -> np.ndarray:
    """N draws of the exponential mechanism on one rng stream."""
    return np.array(
        [
            m.exponential_mechanism(utilities, epsilon=eps, sensitivity=sens, rng=rng, **options)
            for _ in range(N)
        ]
    )


@pytest.mark.parametrize("monotonic", [False, True])
def test_exponential_mechanism_frequencies(monotonic):
    utilities = np.array([0.0, 1.0, 2.0, 4.0])
    eps, sens = 1.0, 2.0
    rng = secure_rng(2)
    draws = _exponential_draws(utilities, eps, sens, rng, monotonic=monotonic)
    factor = 1.0 if monotonic else 2.0
    expected = np.exp(eps * utilities / (factor * sens))
    expected /= expected.sum()
    assert _chi2_matches(draws, expected) > 0.01
    wrong = np.exp(eps * utilities / (factor * sens * 1.5))
    assert _chi2_matches(draws, wrong / wrong.sum()) < 1e-6


def test_exponential_mechanism_with_a_base_measure_draws_mu_times_exp():
    """P(i) ∝ mu_i exp(eps u_i / (2 sens)); -inf in log mu is never drawn."""
    utilities = np.array([0.0, 1.0, 2.0, 4.0, 3.0])
    log_mu = np.log(np.array([0.5, 0.1, 0.3, 0.1, 1.0]))
    log_mu[4] = -np.inf
    eps, sens = 1.0, 2.0
    rng = secure_rng(3)
    draws = _exponential_draws(utilities, eps, sens, rng, log_base_measure=log_mu)
    assert not np.any(draws == 4)
    expected = np.exp(log_mu[:4] + eps * utilities[:4] / (2 * sens))
    assert _chi2_matches(draws, expected / expected.sum()) > 0.01
    uniform_base = np.exp(eps * utilities[:4] / (2 * sens))
    assert _chi2_matches(draws, uniform_base / uniform_base.sum()) < 1e-6


@pytest.mark.parametrize(
    "log_mu", [np.array([0.0, np.nan]), np.array([0.0, np.inf]), np.full(2, -np.inf), np.zeros(3)]
)
def test_exponential_mechanism_rejects_a_bad_base_measure(log_mu):
    with pytest.raises(ValueError):
        m.exponential_mechanism(
            [0.0, 1.0], epsilon=1.0, sensitivity=1.0, rng=secure_rng(0), log_base_measure=log_mu
        )


def test_rng_seeding():
    assert secure_rng(1).random() == secure_rng(1).random()
    assert secure_rng().random() != secure_rng().random()


@pytest.mark.parametrize(
    "call",
    [
        lambda r: m.gaussian_mechanism(1.0, sensitivity=0.0, noise_multiplier=1.0, rng=r),
        lambda r: m.laplace_mechanism(1.0, sensitivity=1.0, epsilon=-1.0, rng=r),
        lambda r: m.laplace_mechanism([1.0, np.nan], sensitivity=1.0, epsilon=1.0, rng=r),
        lambda r: m.laplace_mechanism([np.inf], sensitivity=1.0, epsilon=1.0, rng=r),
        lambda r: m.exponential_mechanism([], epsilon=1.0, sensitivity=1.0, rng=r),
    ],
)
def test_bad_parameters_raise_value_error(call):
    with pytest.raises(ValueError):
        call(secure_rng(0))

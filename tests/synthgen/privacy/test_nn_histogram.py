"""The DP nearest-neighbour histogram of Private Evolution: its votes against a brute-force
oracle, its sensitivity on neighbouring datasets, its noise law (KS), its threshold and its
accounting against dp-accounting (fixed seeds)."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy import optimize, stats

from synthgen.privacy import accounting
from synthgen.privacy.nn_histogram import (
    calibrate_nn_histogram,
    dp_nn_histogram,
    nearest_neighbour_votes,
    nn_histogram_event,
)


def _unit(rng, n, d=8):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _oracle(private, candidates, votes, p_groups, c_groups):
    counts = np.zeros(len(candidates))
    for p, g in zip(private, p_groups, strict=True):
        members = [i for i in range(len(candidates)) if c_groups[i] == g]
        dist = sorted((float(np.sum((p - candidates[i]) ** 2)), i) for i in members)
        for _, i in dist[:votes]:
            counts[i] += 1
    return counts


@pytest.mark.parametrize(("votes", "chunk"), [(1, 17), (3, 17), (2, 1), (2, 7)])
def test_votes_match_a_brute_force_oracle_within_groups(votes, chunk):
    rng = np.random.default_rng(0)
    private, candidates = _unit(rng, 200), _unit(rng, 30)
    candidates[[5, 15, 25]] = candidates[[4, 14, 24]]  # exact ties: the lower index wins
    p_groups, c_groups = rng.integers(0, 3, 200), np.repeat(np.arange(3), 10)
    counts = nearest_neighbour_votes(
        private, candidates, votes=votes, private_groups=p_groups, candidate_groups=c_groups,
        chunk=chunk,
    )  # fmt: skip
    np.testing.assert_array_equal(counts, _oracle(private, candidates, votes, p_groups, c_groups))
    for g in range(3):  # a group's candidates get exactly k votes per private row of the group
        assert counts[c_groups == g].sum() == votes * np.sum(p_groups == g)


def test_a_private_row_of_a_group_without_candidates_casts_no_vote():
    rng = np.random.default_rng(1)
    counts = nearest_neighbour_votes(
        _unit(rng, 5), _unit(rng, 4), votes=2, private_groups=[0, 0, 1, 1, 1],
        candidate_groups=[0, 0, 0, 0],
    )  # fmt: skip
    assert counts.sum() == 4  # only the two rows of group 0 vote


@pytest.mark.parametrize(("votes", "chunk"), [(1, 1024), (4, 1024), (2, 2), (2, 7)])
def test_neighbouring_datasets_move_the_counts_by_the_declared_sensitivity(votes, chunk):
    # Add/remove one private sample: exactly `votes` counts change, each by 1, so the L2
    # distance is sqrt(votes) -- the sensitivity the noise is scaled to. 57 rows: the last
    # block holds one row for chunk 2 and 7; duplicate candidates make exact ties.
    rng = np.random.default_rng(2)
    private, candidates = _unit(rng, 57), _unit(rng, 12)
    candidates[[3, 9]] = candidates[[2, 8]]
    groups = np.repeat([0, 1], 6)
    p_groups = rng.integers(0, 2, 57)
    full = nearest_neighbour_votes(private, candidates, votes=votes, private_groups=p_groups,
                                   candidate_groups=groups, chunk=chunk)  # fmt: skip
    for drop in range(0, 57, 4):
        keep = np.arange(57) != drop
        less = nearest_neighbour_votes(
            private[keep], candidates, votes=votes, private_groups=p_groups[keep],
            candidate_groups=groups, chunk=chunk,
        )  # fmt: skip
        diff = full - less
        assert set(np.unique(diff)) <= {0.0, 1.0}
        assert np.count_nonzero(diff) == votes
        assert np.linalg.norm(diff) == pytest.approx(math.sqrt(votes))
        # the dropped row voted only within its own group
        assert np.all(diff[groups != p_groups[drop]] == 0)


@pytest.mark.parametrize("scale", [1.0, 2 / 3, 3 / 2])
def test_noise_has_the_declared_scale(scale):
    # KS: the released counts minus the exact ones are N(0, (sigma sqrt(k))^2); the test
    # accepts the true std and rejects 2/3 and 3/2 of it.
    sigma, votes = 1.5, 4
    counts = np.full(20_000, 50.0)
    noisy = dp_nn_histogram(counts, noise_multiplier=sigma, votes=votes, threshold=-1e9,
                            rng=np.random.default_rng(3))  # fmt: skip
    p = stats.kstest((noisy - counts) / (scale * sigma * math.sqrt(votes)), "norm").pvalue
    assert (p > 0.01) if scale == 1.0 else (p < 1e-6)


def test_counts_below_the_threshold_are_released_as_zero():
    counts = np.array([0.0, 5.0, 100.0] * 2000)
    noisy = dp_nn_histogram(counts, noise_multiplier=1.0, votes=1, threshold=10.0,
                            rng=np.random.default_rng(4))  # fmt: skip
    assert np.all((noisy == 0) | (noisy >= 10.0))
    assert np.all(noisy[counts == 0] == 0)  # 10 sigma away
    assert np.all(noisy[counts == 100] > 0)
    assert np.all(noisy[counts == 5] == 0)


@pytest.mark.parametrize(("sigma", "iterations", "delta"), [(2.0, 1, 1e-5), (5.0, 4, 1e-6)])
def test_accounting_matches_dp_accounting(sigma, iterations, delta):
    # The same T Gaussian mechanisms composed by dp-accounting's own PLD accountant, and
    # the closed form: T Gaussians of multiplier sigma are one of sigma / sqrt(T).
    ours = accounting.epsilon(nn_histogram_event(sigma, iterations), delta)
    reference = pld_privacy_accountant.PLDAccountant()
    reference.compose(dp_accounting.GaussianDpEvent(sigma), iterations)
    assert ours == pytest.approx(reference.get_epsilon(delta), rel=1e-9)
    # The closed form (Balle & Wang 2018, Thm 8): one Gaussian of multiplier s = sigma/sqrt(T)
    # has delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s); PLD is pessimistic
    # by its discretisation only.
    s = sigma / math.sqrt(iterations)

    def exact_delta(eps):
        return stats.norm.cdf(0.5 / s - eps * s) - math.exp(eps) * stats.norm.cdf(
            -0.5 / s - eps * s
        )

    exact = optimize.brentq(lambda e: exact_delta(e) - delta, 1e-6, 100.0)
    assert exact <= ours <= exact * 1.01


@pytest.mark.parametrize(("target", "iterations"), [(1.0, 3), (4.0, 3), (8.0, 10)])
def test_calibration_meets_the_target_on_the_safe_side(target, iterations):
    delta = 1e-5
    sigma = calibrate_nn_histogram(target, delta, iterations)
    assert accounting.epsilon(nn_histogram_event(sigma, iterations), delta) <= target
    assert accounting.epsilon(nn_histogram_event(sigma - 0.01, iterations), delta) > target


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="votes"):
        nearest_neighbour_votes(np.zeros((1, 2)), np.zeros((1, 2)), votes=0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp_nn_histogram(np.zeros(2), noise_multiplier=0.0, votes=1, threshold=0.0,
                        rng=np.random.default_rng(0))  # fmt: skip
    with pytest.raises(ValueError, match="embeddings"):
        nearest_neighbour_votes(np.zeros((1, 2)), np.zeros((1, 3)))
    with pytest.raises(ValueError, match="iterations"):
        nn_histogram_event(1.0, 0)

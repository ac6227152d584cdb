"""Statistical tests of the DP similarity threshold (`retriever.rag.retrieval`).

The closed form of the threshold's distribution is computed here from oracle utilities that
count the selected documents by brute force at each interval's midpoint, independently of
the library's count bookkeeping; the mechanism's draws are compared with it by chi-square
tests at fixed seeds, each with a negative control that must be rejected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from retriever.rag.retrieval import (
    ScoreRange,
    best_selected,
    dp_top_k_threshold,
    dp_top_p_threshold,
    select,
    threshold_distribution,
)

SCORES6 = np.array([0.08, 0.21, 0.37, 0.52, 0.66, 0.85])
CONCENTRATION = 5.0


def _midpoints(scores01: np.ndarray) -> np.ndarray:
    edges = np.concatenate([[0.0], np.sort(scores01), [1.0]])
    return (edges[:-1] + edges[1:]) / 2.0


def _oracle_top_k(k: int):
    """u = -|#{i : s_i >= tau} - k| per interval, the count taken at the interval midpoint."""

    def utilities(scores01: np.ndarray, counts: np.ndarray) -> np.ndarray:
        selected = np.array([np.sum(scores01 >= tau) for tau in _midpoints(scores01)])
        return -np.abs(selected - k).astype(np.float64)

    return utilities


def _oracle_top_p(p: float, concentration: float = CONCENTRATION):
    """u = -|sum_{s_i >= tau} w_i - p * sum_i w_i|, w_i = exp(concentration * (s_i - 1))."""

    def utilities(scores01: np.ndarray, counts: np.ndarray) -> np.ndarray:
        weights = np.exp(concentration * (scores01 - 1.0))
        selected = np.array([weights[scores01 >= tau].sum() for tau in _midpoints(scores01)])
        return -np.abs(selected - p * weights.sum())

    return utilities


def _count_probabilities(scores01: np.ndarray, utility, epsilon: float) -> np.ndarray:
    """P(len(select) = c) for c = 0..n from `threshold_distribution` (sum over intervals)."""
    _, _, probs = threshold_distribution(scores01, utility, epsilon)
    counts = np.array([np.sum(scores01 >= tau) for tau in _midpoints(scores01)])
    return np.bincount(counts, weights=probs, minlength=scores01.size + 1)


def _chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    if np.any(observed[expected == 0] > 0):
        return 0.0
    support = expected > 0
    return float(stats.chisquare(observed[support], expected[support]).pvalue)


def _selected_counts(draw, scores: np.ndarray, n_draws: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sizes = [len(select(scores, draw(scores, rng))) for _ in range(n_draws)]
    return np.bincount(sizes, minlength=scores.size + 1)


def test_top_k_selection_frequencies_match_closed_form():
    k, epsilon = 3, 2.0
    observed = _selected_counts(
        lambda s, rng: dp_top_k_threshold(s, k, epsilon, rng), SCORES6, 20_000, seed=0
    )
    expected = _count_probabilities(SCORES6, _oracle_top_k(k), epsilon)
    assert np.all(expected * observed.sum() >= 5)  # the chi-square approximation holds
    assert _chi2_pvalue(observed, expected) > 1e-3
    # negative control: the same draws are not those of twice the epsilon
    wrong = _count_probabilities(SCORES6, _oracle_top_k(k), 2 * epsilon)
    assert _chi2_pvalue(observed, wrong) < 1e-6


def test_top_p_selection_frequencies_match_closed_form():
    p, epsilon = 0.5, 8.0
    observed = _selected_counts(
        lambda s, rng: dp_top_p_threshold(s, p, epsilon, rng, concentration=CONCENTRATION),
        SCORES6,
        20_000,
        seed=1,
    )
    expected = _count_probabilities(SCORES6, _oracle_top_p(p), epsilon)
    assert np.all(expected * observed.sum() >= 5)
    assert _chi2_pvalue(observed, expected) > 1e-3
    wrong = _count_probabilities(SCORES6, _oracle_top_p(p), 2 * epsilon)
    assert _chi2_pvalue(observed, wrong) < 1e-6


def test_threshold_distribution_is_a_distribution_over_the_intervals():
    left, lengths, probs = threshold_distribution(SCORES6, _oracle_top_k(2), 1.0)
    np.testing.assert_allclose(left, np.concatenate([[0.0], SCORES6]))
    np.testing.assert_allclose(lengths, np.diff(np.concatenate([[0.0], SCORES6, [1.0]])))
    assert probs.sum() == pytest.approx(1.0)
    # probability ∝ length * exp(epsilon * u / 2), written out
    weights = lengths * np.exp(1.0 * _oracle_top_k(2)(SCORES6, None) / 2.0)
    np.testing.assert_allclose(probs, weights / weights.sum(), rtol=1e-12)


def test_top_k_mode_at_large_epsilon_selects_exactly_k():
    rng = np.random.default_rng(2)
    scores = rng.uniform(0.0, 1.0, size=50)
    k = 10
    sizes = [len(select(scores, dp_top_k_threshold(scores, k, 50.0, rng))) for _ in range(2000)]
    histogram = np.bincount(sizes, minlength=51)
    assert int(np.argmax(histogram)) == k  # sarus-tech/dp-rag's mode would be k - 2
    assert histogram[k] / len(sizes) >= 0.9


def test_top_p_mode_at_large_epsilon_selects_the_share_closest_to_p():
    rng = np.random.default_rng(0)
    scores = rng.uniform(0.0, 1.0, size=20)
    p, epsilon = 0.4, 200.0
    # brute force: a threshold selects a top-c set; find the c whose weight is closest to p W
    weights = np.sort(np.exp(CONCENTRATION * (scores - 1.0)))[::-1]
    top_c_weight = np.concatenate([[0.0], np.cumsum(weights)])
    distance = np.abs(top_c_weight - p * weights.sum())
    best = int(np.argmin(distance))
    gap = np.sort(distance)[1] - distance[best]
    assert epsilon * gap / 2.0 > 15.0  # the runner-up is e^15 less likely per unit length
    sizes = [
        len(select(scores, dp_top_p_threshold(scores, p, epsilon, rng, concentration=5.0)))
        for _ in range(2000)
    ]
    histogram = np.bincount(sizes, minlength=21)
    assert int(np.argmax(histogram)) == best
    assert histogram[best] / len(sizes) >= 0.9


@pytest.mark.parametrize(
    "scores",
    [
        [],
        [1.0, 1.0, 1.0],
        [0.0, 0.0],
        [-3.0, 0.2, 0.2, 7.0],
        np.random.default_rng(3).uniform(0.0, 1.0, size=9),
    ],
)
def test_tau_is_in_the_half_open_unit_interval(scores):
    rng = np.random.default_rng(4)
    for epsilon in (0.1, 1.0, 30.0):
        for _ in range(200):
            for tau in (
                dp_top_k_threshold(scores, 2, epsilon, rng),
                dp_top_p_threshold(scores, 0.3, epsilon, rng),
            ):
                assert 0.0 < tau <= 1.0


def test_scores_at_or_below_min_score_are_never_selected():
    score_range = ScoreRange(min_score=0.3, max_score=0.8)
    scores = np.array([-1.0, 0.1, 0.3, 0.31, 0.5, 0.79, 0.8, 2.0])
    never, always = {0, 1, 2}, {6, 7}  # clipped to 0 (tau > 0) / to 1 (tau <= 1)
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(2000):
        for tau in (
            dp_top_k_threshold(scores, 6, 0.2, rng, score_range=score_range),
            dp_top_p_threshold(scores, 0.9, 0.2, rng, score_range=score_range),
        ):
            chosen = set(select(scores, tau, score_range).tolist())
            assert chosen.isdisjoint(never)
            assert always <= chosen
            seen |= chosen
    assert seen == {3, 4, 5, 6, 7}  # the test is not vacuous: every eligible doc appears


def test_select_returns_the_set_above_tau_best_first():
    rng = np.random.default_rng(6)
    score_range = ScoreRange(min_score=-0.5, max_score=1.5)
    scores = rng.uniform(-1.0, 2.0, size=40)
    scores[:3] = scores[3]  # ties
    normalised = (np.clip(scores, -0.5, 1.5) - (-0.5)) / 2.0
    for tau in np.concatenate([rng.uniform(0.0, 1.0, 50), normalised[:10], [0.0, 1.0]]):
        chosen = select(scores, tau, score_range)
        assert set(chosen.tolist()) == set(np.flatnonzero(normalised >= tau).tolist())
        assert len(chosen) == len(set(chosen.tolist()))
        assert np.all(np.diff(normalised[chosen]) <= 0)


def _density(scores01: np.ndarray, utility, epsilon: float, taus: np.ndarray) -> np.ndarray:
    """The piecewise-constant density of tau: interval probability / interval length."""
    left, lengths, probs = threshold_distribution(scores01, utility, epsilon)
    edges = np.append(left, 1.0)
    j = np.searchsorted(edges, taus, side="left") - 1  # tau in (e_j, e_{j+1}]
    assert np.all(lengths[j] > 0)
    return probs[j] / lengths[j]


@pytest.mark.parametrize("kind", ["top_k", "top_p"])
@pytest.mark.parametrize("epsilon", [0.3, 2.0, 12.0])
def test_neighbouring_score_vectors_change_the_density_by_at_most_e_epsilon(kind, epsilon):
    rng = np.random.default_rng(7)
    taus = np.concatenate([rng.uniform(0.0, 1.0, 500), np.linspace(0.0005, 0.9995, 500)])
    utility = _oracle_top_k(3) if kind == "top_k" else _oracle_top_p(0.4)
    for trial in range(40):
        scores = rng.uniform(0.0, 1.0, size=int(rng.integers(0, 9)))
        extra = [rng.uniform(), 0.0, 1.0, scores[0] if scores.size else 0.5][trial % 4]
        neighbour = np.append(scores, extra)
        log_ratio = np.log(_density(scores, utility, epsilon, taus)) - np.log(
            _density(neighbour, utility, epsilon, taus)
        )
        assert np.max(np.abs(log_ratio)) <= epsilon + 1e-9


@pytest.mark.parametrize(
    ("call", "bad"),
    [
        (lambda rng: dp_top_k_threshold(SCORES6, 0, 1.0, rng), "k=0"),
        (lambda rng: dp_top_k_threshold(SCORES6, -1, 1.0, rng), "k=-1"),
        (lambda rng: dp_top_k_threshold(SCORES6, 2.5, 1.0, rng), "k=2.5"),
        (lambda rng: dp_top_k_threshold(SCORES6, True, 1.0, rng), "k=True"),
        (lambda rng: dp_top_k_threshold(SCORES6, 2, 0.0, rng), "epsilon=0"),
        (lambda rng: dp_top_k_threshold(SCORES6, 2, -1.0, rng), "epsilon<0"),
        (lambda rng: dp_top_k_threshold(SCORES6, 2, math.nan, rng), "epsilon=nan"),
        (lambda rng: dp_top_k_threshold(SCORES6, 2, math.inf, rng), "epsilon=inf"),
        (lambda rng: dp_top_p_threshold(SCORES6, 0.5, 0.0, rng), "top-p epsilon=0"),
        (lambda rng: dp_top_p_threshold(SCORES6, 0.5, math.nan, rng), "top-p epsilon=nan"),
        (lambda rng: dp_top_k_threshold([0.1, math.nan], 1, 1.0, rng), "nan score"),
        (lambda rng: dp_top_k_threshold([0.1, math.inf], 1, 1.0, rng), "inf score"),
        (lambda rng: dp_top_p_threshold([0.1, -math.inf], 0.5, 1.0, rng), "-inf score"),
        (lambda rng: dp_top_k_threshold(np.ones((2, 3)) / 2, 1, 1.0, rng), "2-D scores"),
        (lambda rng: dp_top_p_threshold(np.ones((2, 3)) / 2, 0.5, 1.0, rng), "2-D top-p"),
        (lambda rng: select(np.ones((2, 3)) / 2, 0.5), "2-D select"),
        (lambda rng: dp_top_p_threshold(SCORES6, 0.0, 1.0, rng), "p=0"),
        (lambda rng: dp_top_p_threshold(SCORES6, 1.0, 1.0, rng), "p=1"),
        (lambda rng: dp_top_p_threshold(SCORES6, -0.2, 1.0, rng), "p<0"),
        (lambda rng: dp_top_p_threshold(SCORES6, 1.5, 1.0, rng), "p>1"),
        (lambda rng: dp_top_p_threshold(SCORES6, math.nan, 1.0, rng), "p=nan"),
        (lambda rng: ScoreRange(1.0, 1.0), "min=max"),
        (lambda rng: ScoreRange(1.0, 0.0), "min>max"),
        (lambda rng: ScoreRange(math.nan, 1.0), "nan range"),
        (lambda rng: ScoreRange(0.0, math.inf), "inf range"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_bad_inputs_raise_value_error(call, bad):
    with pytest.raises(ValueError):
        call(np.random.default_rng(0))


def _votes(scores: np.ndarray, greedy: np.ndarray, tau: float, max_voters: int) -> np.ndarray:
    """The vote histogram of the voters the answer stage builds: the DP selection's best
    `max_voters` rows at the fixed shape (`best_selected`), one voter each, padding rows
    masked."""
    if scores.size == 0:
        return np.zeros(6)
    indices, weights, _ = best_selected(scores, tau, max_voters, ScoreRange(0.0, 1.0))
    return np.bincount(greedy[indices], weights=weights, minlength=6)


@pytest.mark.parametrize("max_voters", [1, 4, 16, 64])
def test_one_document_changes_the_vote_histogram_by_one_vote_in_and_one_out(max_voters):
    """Neighbouring collections (one document added) at the same released threshold: at
    most +1 in one count and -1 in another, the swap keywords' group step
    (`keyword_vote.group_parameters`) and icl's capped sensitivity are calibrated for."""
    rng = np.random.default_rng(max_voters)
    worst_l1 = 0
    for _ in range(300):
        n = int(rng.integers(0, 40))
        scores, greedy = rng.uniform(size=n + 1), rng.integers(0, 6, size=n + 1)
        tau = float(rng.uniform(0.0, 0.9))
        where = int(rng.integers(0, n + 1))  # the added document, anywhere in the order
        keep = np.arange(n + 1) != where
        before = _votes(scores[keep], greedy[keep], tau, max_voters)
        after = _votes(scores, greedy, tau, max_voters)
        diff = after - before
        assert np.all(np.abs(diff) <= 1)
        assert np.sum(diff > 0) <= 1 and np.sum(diff < 0) <= 1
        worst_l1 = max(worst_l1, int(np.abs(diff).sum()))
    assert worst_l1 == (2 if max_voters < 40 else 1)  # the swap happens when the cap binds

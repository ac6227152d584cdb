"""Individual-mode selection by brute force: on small worlds, the answer token's exact
distribution with and without one document, for a document below tau, an exhausted one, a
payer in the rows and a payer past the cap."""

import numpy as np
import pytest
from scipy.special import logsumexp

from retriever.rag.aggregation import AggregationConfig, token_probabilities
from retriever.rag.individual import individual_rows
from synthgen.privacy.individual import bounded_range_rho

VOCAB, ROWS, EPSILON = 6, 3, 1.5
CONFIG = AggregationConfig()


def _token_distribution(scores, logprobs, public, active, tau):
    order, weights, payers = individual_rows(scores, tau, ROWS, active)
    rows = logprobs[order] if len(scores) else np.zeros((ROWS, VOCAB))
    probabilities = token_probabilities(
        rows, public, epsilon=EPSILON, config=CONFIG, weights=weights, capped=True
    )
    return probabilities, payers


def _world(rng, n):
    # half the worlds have ties (scores clipped at the range's ends, duplicate texts)
    scores = rng.uniform(0, 1, n) if rng.random() < 0.5 else rng.choice([0.0, 0.6, 1.0], n)
    logprobs = rng.normal(0, 2, (n, VOCAB))
    logprobs -= logsumexp(logprobs, axis=1, keepdims=True)
    public = rng.normal(0, 1, VOCAB)
    public -= logsumexp(public)
    active = rng.uniform(size=n) < 0.8
    return scores, logprobs, public, active


def test_non_payers_change_nothing_and_payers_stay_within_the_token_mechanism():
    rng = np.random.default_rng(7)
    seen = {"below": 0, "exhausted": 0, "in_rows": 0, "past_cap": 0}
    worst = 0.0
    for _ in range(800):
        n = int(rng.integers(1, 8))
        scores, logprobs, public, active = _world(rng, n)
        tau = float(rng.choice([0.0, 0.3, 0.6]))
        full, payers = _token_distribution(scores, logprobs, public, active, tau)
        order, weights, _ = individual_rows(scores, tau, ROWS, active)
        in_rows = set(order[weights == 1].tolist())
        for i in range(n):
            keep = np.arange(n) != i
            without, payers_without = _token_distribution(
                scores[keep], logprobs[keep], public, active[keep], tau
            )
            # whether another document pays never depends on i (the filter's condition)
            assert np.array_equal(payers_without, payers[keep])
            log_ratio = np.log(full) - np.log(without)
            if not payers[i]:
                seen["exhausted" if not active[i] else "below"] += 1
                np.testing.assert_allclose(full, without, rtol=1e-12, atol=0)
                continue
            seen["in_rows" if i in in_rows else "past_cap"] += 1
            if i not in in_rows:  # pays, but changes nothing
                np.testing.assert_allclose(full, without, rtol=1e-12, atol=0)
            # epsilon-DP and epsilon-bounded-range (the charged rho = eps^2/8 per token)
            assert np.max(np.abs(log_ratio)) <= EPSILON + 1e-9
            assert np.ptp(log_ratio) <= EPSILON + 1e-9
            for p, q in ((full, without), (without, full)):
                for alpha in (2.0, 8.0):
                    divergence = logsumexp(alpha * np.log(p) + (1 - alpha) * np.log(q)) / (
                        alpha - 1
                    )
                    assert divergence <= alpha * bounded_range_rho(EPSILON) + 1e-9
            worst = max(worst, float(np.max(np.abs(log_ratio))))
    assert min(seen.values()) >= 20, seen  # every case was exercised
    assert worst > 0.3 * EPSILON  # a payer in the rows does move the answer


def test_exhausted_documents_are_in_no_row_even_at_tau_zero():
    scores = np.array([0.9, 0.8, 0.1, 0.05])
    active = np.array([False, True, True, True])
    order, weights, payers = individual_rows(scores, 0.0, 2, active)
    assert order[weights == 1].tolist() == [1, 2]
    assert payers.tolist() == [False, True, True, True]  # index 3 pays past the cap
    with pytest.raises(ValueError, match="one entry per score"):
        individual_rows(scores, 0.5, 2, active[:3])
    with pytest.raises(ValueError, match="tau"):
        individual_rows(scores, 1.5, 2, active)


def test_rows_follow_a_total_order_so_ties_never_let_an_outsider_choose():
    from retriever.rag.retrieval import best_selected

    rng = np.random.default_rng(11)
    for _ in range(2000):
        n, rows = int(rng.integers(1, 12)), int(rng.integers(1, 5))
        scores = rng.choice([0.0, 0.3, 1.0], n)
        order, weights, _ = best_selected(scores, 0.0, rows)
        used = set(order[weights == 1].tolist())
        for i in range(n):
            keep = np.flatnonzero(np.arange(n) != i)
            order_i, weights_i, _ = best_selected(scores[keep], 0.0, rows)
            used_i = {int(keep[j]) for j in order_i[weights_i == 1]}
            if i not in used:  # a document outside the rows changes nothing
                assert used_i == used
            else:  # one in them: its row goes, at most one other comes in
                assert used_i <= used | set(keep.tolist()) and len(used_i - used) <= 1
                assert used - used_i == {i}

"""Tests of DP in-context aggregation (`retriever.rag.aggregation`).

Sensitivity tests build neighbouring private row sets (one document row added) and bound
the change of the utilities and of the closed-form token distribution; statistical tests
compare `dp_icl_token`'s draws with `token_probabilities` at a fixed seed, with a negative
control that must be rejected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from retriever.rag.aggregation import (
    PUBLIC_LOGPROB_FLOOR,
    AggregationConfig,
    clipped_contributions,
    dp_icl_token,
    log_base_measure,
    token_probabilities,
    token_utilities,
)

CONFIGS = [
    AggregationConfig(),
    AggregationConfig(alpha=0.2, clip=0.7, beta=0.0),
    AggregationConfig(alpha=5.0, clip=0.05, beta=1.0),
    AggregationConfig(alpha=1e-3, clip=3.0, beta=3.0, beta_fade_epsilon=4.0),
]


def _logprobs(rng: np.random.Generator, rows: int, vocab: int, scale: float = 3.0) -> np.ndarray:
    """Random next-token log-probabilities (log-softmax of Gaussian logits)."""
    logits = rng.normal(0.0, scale, size=(rows, vocab))
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def _with_impossible_tokens(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    """Sets a random minority of entries to -inf (tokens the model never emits)."""
    out = rows.copy()
    mask = rng.random(out.shape) < 0.3
    mask[np.arange(out.shape[0]), np.argmax(out, axis=1)] = False  # keep each row's max
    out[mask] = -np.inf
    return out


def _chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("config", CONFIGS)
def test_clipped_contributions_are_bounded_by_clip(config):
    rng = np.random.default_rng(0)
    for scale in (0.1, 3.0, 30.0):
        rows = _with_impossible_tokens(rng, _logprobs(rng, 16, 50, scale))
        out = clipped_contributions(rows, config)
        assert out.shape == rows.shape
        assert np.all(np.isfinite(out))
        assert np.max(np.abs(out)) <= config.clip * (1 + 1e-12)


@pytest.mark.parametrize("alpha", [0.01, 0.5, 1.0, 4.0])
def test_a_clip_of_half_the_transformed_range_scales_nothing(alpha):
    rng = np.random.default_rng(1)
    rows = _with_impossible_tokens(rng, _logprobs(rng, 8, 30))
    shifted = rows - rows.max(axis=1, keepdims=True)
    transformed = np.expm1(alpha * shifted) / alpha
    centred = (
        transformed - (transformed.max(1, keepdims=True) + transformed.min(1, keepdims=True)) / 2
    )
    for clip in (1 / (2 * alpha), 2 / alpha):
        out = clipped_contributions(rows, AggregationConfig(alpha=alpha, clip=clip))
        np.testing.assert_allclose(out, centred, rtol=1e-12, atol=1e-15)


def test_clipping_scales_each_row_to_norm_clip():
    rng = np.random.default_rng(2)
    rows = _logprobs(rng, 6, 20)
    config = AggregationConfig(alpha=1.0, clip=0.1)  # < 1 / (2 alpha): every row clipped
    out = clipped_contributions(rows, config)
    unclipped = clipped_contributions(rows, AggregationConfig(alpha=1.0, clip=10.0))
    np.testing.assert_allclose(np.max(np.abs(out), axis=1), config.clip, rtol=1e-12)
    # a uniform scale per row: the direction is unchanged
    scale = config.clip / np.max(np.abs(unclipped), axis=1, keepdims=True)
    np.testing.assert_allclose(out, unclipped * scale, rtol=1e-12, atol=1e-15)


def test_minus_infinity_log_probabilities_give_finite_output():
    rows = np.array([[0.0, -np.inf, -np.inf, -1.0], [-np.inf, -0.5, -1.2, -np.inf]])
    out = clipped_contributions(rows, AggregationConfig(alpha=1.0, clip=0.5))
    assert np.all(np.isfinite(out))
    # an impossible token sits at the bottom of its row's range: -clip after centring
    assert out[0, 1] == out[0, 2] == pytest.approx(-0.5)
    public = np.array([-np.inf, 0.0, -np.inf, -1.0])
    config = AggregationConfig(alpha=1.0, clip=0.5, beta=2.0, beta_fade_epsilon=math.inf)
    utilities = token_utilities(rows, public.size, config)
    np.testing.assert_allclose(utilities, clipped_contributions(rows, config).sum(axis=0))
    # the base measure of an impossible token is beta times the finite floor
    base = log_base_measure(public, epsilon=1.0, config=config)
    np.testing.assert_allclose(
        base, 2.0 * np.array([PUBLIC_LOGPROB_FLOOR, 0, PUBLIC_LOGPROB_FLOOR, -1])
    )
    probs = token_probabilities(rows, public, epsilon=1.0, config=config)
    assert np.all(np.isfinite(probs)) and probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad",
    [
        np.array([[0.0, math.nan, -1.0]]),
        np.array([[0.0, math.inf, -1.0]]),
        np.zeros(3),  # not [M, V]
    ],
)
def test_invalid_log_probabilities_raise(bad):
    with pytest.raises(ValueError):
        clipped_contributions(bad, AggregationConfig())


def test_nan_in_a_private_row_raises_in_the_mechanism():
    rows = np.array([[0.0, -1.0, math.nan]])
    with pytest.raises(ValueError):
        dp_icl_token(
            rows,
            np.log(np.full(3, 1 / 3)),
            epsilon=1.0,
            config=AggregationConfig(),
            rng=np.random.default_rng(0),
            capped=False,
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 0.0},
        {"alpha": -1.0},
        {"alpha": math.nan},
        {"clip": 0.0},
        {"clip": math.inf},
        {"beta": -0.1},
        {"beta": math.nan},
        {"beta": math.inf},
        {"beta_fade_epsilon": 0.0},
        {"beta_fade_epsilon": -1.0},
        {"beta_fade_epsilon": math.nan},
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        AggregationConfig(**kwargs)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adding_one_document_moves_every_utility_by_at_most_clip(config, seed):
    rng = np.random.default_rng(seed)
    vocab = 40
    for _ in range(25):
        rows = _logprobs(rng, int(rng.integers(0, 7)), vocab, scale=float(rng.uniform(0.1, 20)))
        extra = _logprobs(rng, 1, vocab, scale=float(rng.uniform(0.1, 20)))
        if rng.random() < 0.5:
            extra = _with_impossible_tokens(rng, extra)
        before = token_utilities(rows, vocab, config)
        after = token_utilities(np.concatenate([rows, extra]), vocab, config)
        assert np.max(np.abs(after - before)) <= config.clip * (1 + 1e-12)


def test_token_frequencies_match_the_closed_form():
    rng = np.random.default_rng(3)
    vocab, epsilon, config = 6, 1.0, AggregationConfig(alpha=1.0, clip=0.5, beta=0.7)
    private = _logprobs(rng, 4, vocab)
    public = _logprobs(rng, 1, vocab)[0]
    probs = token_probabilities(private, public, epsilon=epsilon, config=config)
    assert probs.min() * 20_000 >= 5
    draws = [
        dp_icl_token(private, public, epsilon=epsilon, config=config, rng=rng, capped=False)
        for _ in range(20_000)
    ]
    observed = np.bincount(draws, minlength=vocab)
    assert _chi2_pvalue(observed, probs) > 1e-3
    wrong = token_probabilities(private, public, epsilon=2 * epsilon, config=config)
    assert _chi2_pvalue(observed, wrong) < 1e-6


def test_a_token_every_document_rejects_is_still_eligible():
    rng = np.random.default_rng(4)
    vocab, rare = 6, 5
    private = _logprobs(rng, 4, vocab)
    private[:, rare] = -30.0  # the lowest log-probability in every private row
    private -= np.logaddexp.reduce(private, axis=1, keepdims=True)
    assert np.all(np.argmin(private, axis=1) == rare)
    public = np.log(np.full(vocab, 1 / vocab))
    config, epsilon = AggregationConfig(), 0.5
    probs = token_probabilities(private, public, epsilon=epsilon, config=config)
    draws = np.array(
        [
            dp_icl_token(private, public, epsilon=epsilon, config=config, rng=rng, capped=False)
            for _ in range(5000)
        ]
    )
    hits = int(np.sum(draws == rare))
    assert hits > 0  # no top-k cut on private scores
    # and at the closed-form rate (binomial two-sided test)
    assert stats.binomtest(hits, draws.size, probs[rare]).pvalue > 1e-3


@pytest.mark.parametrize("epsilon", [0.05, 3.0])
def test_with_no_private_rows_the_draw_is_the_public_distribution_to_the_power_beta(epsilon):
    """The base measure keeps its weight at any epsilon (it is not scaled by epsilon)."""
    rng = np.random.default_rng(5)
    vocab = 6
    config = AggregationConfig(alpha=1.0, clip=0.5, beta=1.5, beta_fade_epsilon=math.inf)
    public = _logprobs(rng, 1, vocab, scale=1.0)[0]
    no_rows = np.zeros((0, vocab))
    power = np.exp(public) ** 1.5  # P(v) ∝ p_public(v) ** beta, whatever epsilon
    closed_form = power / power.sum()
    probs = token_probabilities(no_rows, public, epsilon=epsilon, config=config)
    np.testing.assert_allclose(probs, closed_form, rtol=1e-12)
    draws = [
        dp_icl_token(no_rows, public, epsilon=epsilon, config=config, rng=rng, capped=False)
        for _ in range(20_000)
    ]
    observed = np.bincount(draws, minlength=vocab)
    assert _chi2_pvalue(observed, closed_form) > 1e-3
    plain = np.exp(public)  # beta = 1: a different distribution, rejected
    assert _chi2_pvalue(observed, plain / plain.sum()) < 1e-6
    uniform = np.full(vocab, 1 / vocab)
    assert _chi2_pvalue(observed, uniform) < 1e-6


def test_public_power_fades_linearly_with_the_token_epsilon():
    config = AggregationConfig(beta=2.0, beta_fade_epsilon=4.0)
    assert config.public_power(0.0) == 2.0
    assert config.public_power(1.0) == pytest.approx(1.5)
    assert config.public_power(4.0) == 0.0
    assert config.public_power(9.0) == 0.0
    assert AggregationConfig(beta=0.8, beta_fade_epsilon=math.inf).public_power(100.0) == 0.8


def test_at_large_epsilon_the_documents_outweigh_the_public_prior():
    """A token every document prefers wins against a public prior that rejects it."""
    vocab, favourite = 8, 5
    public = np.log(np.full(vocab, 0.5 / (vocab - 1)))
    public[favourite] = np.log(1e-4)
    public -= np.logaddexp.reduce(public)
    rows = np.full((20, vocab), np.log(0.1 / (vocab - 1)))
    rows[:, favourite] = np.log(0.9)
    config = AggregationConfig(beta=1.0, beta_fade_epsilon=8.0)
    small = token_probabilities(rows, public, epsilon=0.05, config=config)
    large = token_probabilities(rows, public, epsilon=8.0, config=config)
    assert small[favourite] < 0.01
    assert large[favourite] > 0.99


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 8.0])
def test_neighbouring_row_sets_change_log_probabilities_by_at_most_epsilon(config, epsilon):
    """With the public base measure p_public^beta(epsilon) (the same in both neighbours)."""
    rng = np.random.default_rng(6)
    vocab = 30
    worst = 0.0
    for _ in range(40):
        public = _logprobs(rng, 1, vocab, scale=0.5)[0]  # mild: no probability underflows
        rows = _logprobs(rng, int(rng.integers(0, 8)), vocab, scale=float(rng.uniform(0.1, 20)))
        extra = _with_impossible_tokens(rng, _logprobs(rng, 1, vocab, scale=20.0))
        p = token_probabilities(rows, public, epsilon=epsilon, config=config)
        q = token_probabilities(
            np.concatenate([rows, extra]), public, epsilon=epsilon, config=config
        )
        assert np.all(p > 0) and np.all(q > 0)
        ratio = np.log(p) - np.log(q)
        gap = np.max(np.abs(ratio))
        assert gap <= epsilon + 1e-9  # epsilon-DP
        assert np.ptp(ratio) <= epsilon + 1e-9  # epsilon-bounded range
        worst = max(worst, gap / epsilon)
    assert worst > 0.5  # the bound is nearly reached: the check is not vacuous

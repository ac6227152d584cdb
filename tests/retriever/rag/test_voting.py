"""Tests of the vote-based token release (`retriever.rag.voting`).

The voters (one selected document each, up to a public cap) are checked for the property
the privacy proof needs (one document moves one vote in and one out); `dp_vote_token` for
its bottom-symbol behaviour, its candidate set and the LimitedDomain parameters it passes;
`SparseVoteGate` for its pay-what-you-use charges.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from scipy import stats

from retriever.rag import voting
from retriever.rag.retrieval import ScoreRange, best_selected
from retriever.rag.voting import (
    SparseVoteGate,
    answer_key,
    dp_answer_vote,
    dp_vote_token,
    vote_counts,
    vote_threshold,
)
from synthgen.privacy import AboveThreshold


def _votes(scores: np.ndarray, greedy: np.ndarray, tau: float, max_voters: int) -> np.ndarray:
    """The vote histogram the answer stage builds: the DP selection's best `max_voters`
    rows at the fixed shape (`best_selected`), one voter each, padding rows masked."""
    if scores.size == 0:
        return np.zeros(6)
    indices, weights, _ = best_selected(scores, tau, max_voters, ScoreRange(0.0, 1.0))
    return np.bincount(greedy[indices], weights=weights, minlength=6)


@pytest.mark.parametrize("max_voters", [1, 4, 16, 64])
def test_one_document_changes_the_vote_histogram_by_one_vote_in_and_one_out(max_voters):
    """Neighbouring collections (one document added) at the same released threshold: at
    most +1 in one count and -1 in another, the change `dp_vote_token` is calibrated for."""
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


def test_vote_threshold_is_the_noise_free_limited_domain_threshold():
    epsilon, delta = 2.0, 1e-6
    eps, dlt = epsilon / 2, delta / (1 + math.exp(epsilon / 2))
    assert vote_threshold(epsilon, delta) == pytest.approx(1 + math.log(1 / dlt) / eps)
    # counts well above it are released almost always; well below, almost never
    rng = np.random.default_rng(0)
    need = vote_threshold(epsilon, delta)
    for votes, expect in ((need + 12, True), (need - 12, False)):
        counts = np.zeros(8)
        counts[3] = votes
        released = [
            dp_vote_token(counts, epsilon=epsilon, delta=delta, max_candidates=8, rng=rng)
            for _ in range(200)
        ]
        if expect:
            assert np.mean([r == 3 for r in released]) > 0.95
        else:
            assert all(r is None for r in released)


def test_vote_counts_is_the_histogram_of_greedy_tokens():
    rng = np.random.default_rng(0)
    voters = rng.normal(size=(9, 7))
    expected = np.zeros(7)
    for row in voters:
        expected[int(np.argmax(row))] += 1
    np.testing.assert_array_equal(vote_counts(voters, 7), expected)
    np.testing.assert_array_equal(vote_counts(voters.ravel(), 7), expected)
    assert vote_counts(voters, 7).sum() == 9
    np.testing.assert_array_equal(vote_counts(np.zeros((0, 7)), 7), np.zeros(7))


def _release_histogram(counts, n_draws: int, seed: int, **kwargs) -> collections.Counter:
    rng = np.random.default_rng(seed)
    return collections.Counter(dp_vote_token(counts, rng=rng, **kwargs) for _ in range(n_draws))


def test_no_votes_ends_the_answer():
    counts = np.zeros(10)
    outcomes = _release_histogram(counts, 2000, seed=1, epsilon=1.0, delta=1e-6, max_candidates=5)
    assert outcomes[None] / 2000 >= 0.99


def test_a_single_vote_at_small_epsilon_ends_the_answer():
    counts = np.zeros(10)
    counts[3] = 1
    outcomes = _release_histogram(counts, 2000, seed=2, epsilon=0.5, delta=1e-6, max_candidates=5)
    assert outcomes[None] / 2000 >= 0.99


def test_a_clear_majority_is_released():
    counts = np.zeros(10)
    counts[3], counts[7] = 30, 2  # 32 voters
    outcomes = _release_histogram(counts, 2000, seed=3, epsilon=5.0, delta=1e-5, max_candidates=5)
    assert outcomes[3] / 2000 >= 0.99


def test_only_the_top_max_candidates_counts_can_be_released():
    counts = np.zeros(12)
    counts[[4, 9, 1, 6, 11, 0]] = [30, 29, 28, 27, 26, 25]
    counts[[2, 3]] = 5
    outcomes = _release_histogram(counts, 3000, seed=4, epsilon=1.0, delta=0.9, max_candidates=3)
    released = set(outcomes) - {None}
    assert released == {4, 9, 1}  # each of the top 3 appears, nothing else
    # control: with every count a candidate, the 4th-6th counts do come out at this noise
    wide = _release_histogram(counts, 3000, seed=4, epsilon=1.0, delta=0.9, max_candidates=12)
    assert {6, 11, 0} <= set(wide)


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-6), (4.0, 1e-3), (0.2, 0.5)])
def test_limited_domain_runs_at_half_epsilon_and_group_privacy_delta(monkeypatch, epsilon, delta):
    calls = []

    def recording(counts, **kwargs):
        calls.append((np.asarray(counts).copy(), kwargs))
        return 42

    monkeypatch.setattr(voting, "limited_domain_top1", recording)
    counts = np.array([3.0, 0.0, 1.0])
    rng = np.random.default_rng(0)
    assert dp_vote_token(counts, epsilon=epsilon, delta=delta, max_candidates=2, rng=rng) == 42
    ((seen_counts, kwargs),) = calls
    np.testing.assert_array_equal(seen_counts, counts)
    assert kwargs["epsilon"] == pytest.approx(epsilon / 2, rel=1e-15)
    assert kwargs["delta"] == pytest.approx(delta / (1 + math.exp(epsilon / 2)), rel=1e-15)
    assert kwargs["max_candidates"] == 2
    assert kwargs["max_contributions"] == 1  # one vote touches one count
    assert kwargs["rng"] is rng
    # group privacy of size 2 recovers the requested (epsilon, delta)
    eps2, dlt2 = 2 * kwargs["epsilon"], (1 + math.exp(kwargs["epsilon"])) * kwargs["delta"]
    assert (eps2, dlt2) == (pytest.approx(epsilon), pytest.approx(delta))


def _vote_release_probabilities(
    counts: np.ndarray, epsilon: float, delta: float, max_candidates: int
) -> np.ndarray:
    """Closed form of `dp_vote_token`: P(token 0..V-1), then P(None), last.

    LimitedDomain at (e, d) = (epsilon / 2, delta / (1 + e^(epsilon / 2))) perturbs the top
    `max_candidates` counts and the threshold h + 1 + ln(1 / d) / e with i.i.d. Gumbel(1 / e)
    noise and releases the argmax, so by the Gumbel-max identity the outcome o is drawn with
    probability proportional to exp(e * value_o) (Durfee & Rogers 2019, Alg. 1).
    """
    e, d = epsilon / 2, delta / (1 + math.exp(epsilon / 2))
    order = np.argsort(-counts, kind="stable")
    top = order[:max_candidates]
    h_next = counts[order[max_candidates]] if counts.size > max_candidates else 0.0
    logits = np.full(counts.size + 1, -np.inf)
    logits[top] = e * counts[top]
    logits[-1] = e * (h_next + 1 + math.log(1 / d) / e)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def test_vote_release_frequencies_match_the_closed_form():
    counts = np.array([5.0, 4.0, 4.0, 2.0, 0.0, 1.0])
    n_draws = 20_000
    outcomes = _release_histogram(counts, n_draws, seed=5, epsilon=2.0, delta=0.1, max_candidates=3)
    observed = np.array([outcomes[i] for i in range(counts.size)] + [outcomes[None]])
    for epsilon, accept in ((2.0, True), (4.0, False)):  # 4.0: the negative control
        probs = _vote_release_probabilities(counts, epsilon, 0.1, 3)
        support = probs > 0
        assert observed[~support].sum() == 0
        pvalue = stats.chisquare(observed[support], probs[support] * n_draws).pvalue
        assert pvalue > 1e-3 if accept else pvalue < 1e-6


def _hockey_stick(p: np.ndarray, q: np.ndarray, epsilon: float) -> float:
    """sup over outcome sets S of P(S) - e^epsilon Q(S)."""
    return float(np.sum(np.maximum(0.0, p - math.exp(epsilon) * q)))


def test_a_changed_added_or_removed_vote_is_epsilon_delta_private():
    rng = np.random.default_rng(6)
    worst = 0.0
    for trial in range(3000):
        vocab = int(rng.integers(2, 8))
        max_candidates = int(rng.integers(1, vocab + 2))
        counts = rng.integers(0, 6, size=vocab).astype(np.float64)
        epsilon = float(rng.choice([0.1, 0.5, 1.0, 3.0, 8.0]))
        delta = float(rng.choice([1e-6, 1e-3, 0.1]))
        a, b = rng.integers(0, vocab, size=2)
        neighbour = counts.copy()
        if trial % 3 != 1 and neighbour[a] > 0:
            neighbour[a] -= 1  # a voter leaves token a ...
        if trial % 3 != 2:
            neighbour[b] += 1  # ... and / or votes for token b
        p = _vote_release_probabilities(counts, epsilon, delta, max_candidates)
        q = _vote_release_probabilities(neighbour, epsilon, delta, max_candidates)
        divergence = max(_hockey_stick(p, q, epsilon), _hockey_stick(q, p, epsilon))
        assert divergence <= delta * (1 + 1e-9)
        worst = max(worst, divergence / delta)
    assert worst > 0.5  # the bound is nearly reached: the check is not vacuous


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.0, 1e-6), (-1.0, 1e-6), (math.nan, 1e-6), (1.0, 0.0), (1.0, -1e-6)]
)
def test_dp_vote_token_rejects_bad_privacy_parameters(epsilon, delta):
    with pytest.raises(ValueError):
        dp_vote_token(
            np.array([3.0, 1.0]),
            epsilon=epsilon,
            delta=delta,
            max_candidates=1,
            rng=np.random.default_rng(0),
        )


@pytest.mark.parametrize("delta", [1.0, 1.5])
def test_dp_vote_token_rejects_delta_of_one_or_more(delta):
    with pytest.raises(ValueError):
        dp_vote_token(
            np.array([3.0, 1.0]),
            epsilon=1.0,
            delta=delta,
            max_candidates=1,
            rng=np.random.default_rng(0),
        )


VOCAB, PUBLIC, OTHER, VOTERS = 10, 2, 7, 16


def _agree() -> np.ndarray:
    counts = np.zeros(VOCAB)
    counts[PUBLIC] = VOTERS
    return counts


def _disagree() -> np.ndarray:
    counts = np.zeros(VOCAB)
    counts[OTHER] = VOTERS
    return counts


@pytest.fixture
def gate_instances(monkeypatch) -> list[AboveThreshold]:
    """Every AboveThreshold the gate creates, with the arguments it was created with."""
    created = []

    class Recording(AboveThreshold):
        def __init__(self, threshold, **kwargs):
            super().__init__(threshold, **kwargs)
            self.arguments = {"threshold": threshold, **kwargs}
            created.append(self)

    monkeypatch.setattr(voting, "AboveThreshold", Recording)
    return created


def _gate(seed: int, max_releases: int = 3) -> SparseVoteGate:
    return SparseVoteGate(
        threshold=VOTERS / 2,
        gate_epsilon=5.0,
        token_epsilon=5.0,
        token_delta=1e-5,
        max_candidates=4,
        max_releases=max_releases,
        rng=np.random.default_rng(seed),
    )


def _expected_charges(releases: int, open_instance: bool) -> dict:
    out = {}
    if releases:
        out["gate"] = (5.0, 0.0, releases)
        out["tokens"] = (5.0, 1e-5, releases)
    if open_instance:
        out["gate-open"] = (2.5, 0.0, 1)
    return out


def test_agreeing_voters_release_the_public_token_for_free(gate_instances):
    gate = _gate(seed=0)
    assert gate.charges() == {}
    for _ in range(100):
        assert gate.step(_agree(), PUBLIC) == (PUBLIC, False)
    assert gate.releases == 0
    assert gate.charges() == {"gate-open": (2.5, 0.0, 1)}  # one instance, epsilon / 2
    assert len(gate_instances) == 1
    assert gate_instances[0].arguments == {
        "threshold": VOTERS / 2,
        "epsilon": 5.0,
        "sensitivity": 1.0,
        "rng": gate.rng,
    }


def test_disagreeing_voters_fire_the_gate_and_pay_for_the_token():
    gate = _gate(seed=1)
    for releases in (1, 2):
        assert gate.step(_disagree(), PUBLIC) == (OTHER, True)
        assert gate.releases == releases
        assert gate.charges() == _expected_charges(releases, open_instance=False)


def test_the_gate_is_exhausted_after_max_releases():
    gate = _gate(seed=2, max_releases=3)
    for _ in range(3):
        assert not gate.exhausted
        assert gate.step(_disagree(), PUBLIC) == (OTHER, True)
    assert gate.exhausted
    assert gate.charges() == _expected_charges(3, open_instance=False)
    with pytest.raises(RuntimeError):
        gate.step(_agree(), PUBLIC)
    assert gate.charges() == _expected_charges(3, open_instance=False)  # a refusal is free


def test_a_fresh_above_threshold_starts_after_each_release(gate_instances):
    gate = _gate(seed=3, max_releases=4)
    script = ["agree", "agree", "fire", "agree", "fire", "fire", "agree", "agree", "fire"]
    releases = 0
    for move in script:
        if move == "agree":
            assert gate.step(_agree(), PUBLIC) == (PUBLIC, False)
        else:
            assert gate.step(_disagree(), PUBLIC) == (OTHER, True)
            releases += 1
        open_instance = move == "agree"
        # the open-instance charge vanishes on a release and comes back on the next free step
        assert gate.charges() == _expected_charges(releases, open_instance)
        # one instance per firing, plus the open one; every earlier instance has halted
        assert len(gate_instances) == releases + open_instance
        assert all(instance.halted for instance in gate_instances[:releases])
        if open_instance:
            assert not gate_instances[-1].halted
    assert gate.exhausted


def test_answer_keys_ignore_trailing_punctuation_and_unreadable_characters():
    assert answer_key(" Besox  fever.\n") == "Besox fever"
    assert answer_key("Besox fever\ufffd") == "Besox fever"
    assert answer_key("...") == ""


def test_dp_answer_vote_is_limited_domain_over_whole_answers(monkeypatch):
    """It passes LimitedDomain the answers' counts (empty answers cast no vote) and maps
    the winner back to its text."""
    seen = {}

    def fake_vote(counts, **kwargs):
        seen["counts"], seen["kwargs"] = np.asarray(counts), kwargs
        return int(np.argmax(counts))

    monkeypatch.setattr(voting, "dp_vote_token", fake_vote)
    answers = ["Besox fever.", "Besox fever", "Rovanora", "", "besox fever"]
    rng = np.random.default_rng(0)
    got = dp_answer_vote(answers, epsilon=3.0, delta=1e-6, max_candidates=8, rng=rng)
    assert got == "Besox fever"
    assert sorted(seen["counts"].tolist()) == [1.0, 1.0, 2.0]  # 4 votes; case is kept
    assert seen["kwargs"] == {"epsilon": 3.0, "delta": 1e-6, "max_candidates": 8, "rng": rng}


def test_dp_answer_vote_releases_a_strong_majority_and_refuses_a_weak_one():
    rng = np.random.default_rng(1)
    need = vote_threshold(4.0, 1e-6)
    strong = ["Besox fever"] * int(need + 10) + ["Rovanora"] * 3
    weak = ["Besox fever"] * max(1, int(need - 8)) + [f"w{i}" for i in range(30)]
    for _ in range(50):
        assert dp_answer_vote(strong, epsilon=4.0, delta=1e-6, max_candidates=64, rng=rng) == (
            "Besox fever"
        )
        assert dp_answer_vote(weak, epsilon=4.0, delta=1e-6, max_candidates=64, rng=rng) is None
    assert dp_answer_vote([], epsilon=4.0, delta=1e-6, max_candidates=64, rng=rng) is None

"""DP retrieval: a similarity threshold drawn by the exponential mechanism (Grislain 2024).

A question's similarity to every private document is clipped to a public range and mapped
to [0, 1]. A threshold tau in [0, 1] is drawn from the continuous exponential mechanism with
utility ``u(tau) = -|#{i : s_i >= tau} - k|`` (top-k) or the weighted top-p variant, and the
documents with s_i >= tau are selected. Only tau is released; the selected set is private
and only enters the DP answer mechanisms. The density of tau is piecewise constant between
consecutive sorted scores: an interval is drawn with probability proportional to length *
exp(epsilon * u / 2) (`synthgen.privacy.exponential_mechanism`, the log-length folded into
the utility), then tau uniformly inside it. Unlike the reference code (sarus-tech/dp-rag),
whose mode selects k - 2 documents, the interval whose count is k has utility 0. See
docs/guides/dp_rag.md ("How an answer is made").
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from synthgen.privacy import exponential_mechanism


@dataclasses.dataclass(frozen=True)
class ScoreRange:
    """Public clipping range of similarity scores; it must not depend on the private data."""

    min_score: float = 0.0
    max_score: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_score) and math.isfinite(self.max_score)):
            raise ValueError(f"score range must be finite, got {self=}")
        if not self.min_score < self.max_score:
            raise ValueError(f"min_score must be < max_score, got {self=}")

    def normalise(self, scores: np.typing.ArrayLike) -> np.ndarray:
        """Scores clipped to the range and mapped affinely to [0, 1]."""
        array = np.asarray(scores, dtype=np.float64)
        if array.ndim != 1:
            raise ValueError(f"scores must be 1-D, got shape={array.shape}")
        if not np.all(np.isfinite(array)):
            raise ValueError("scores must be finite")
        clipped = np.clip(array, self.min_score, self.max_score)
        return (clipped - self.min_score) / (self.max_score - self.min_score)


def _intervals(scores01: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left ends, lengths, selected counts) of the intervals (e_j, e_{j+1}] of [0, 1].

    With sorted scores s_(1) <= ... <= s_(n) and e_0 = 0, e_{n+1} = 1, a threshold tau in
    (e_j, e_{j+1}] selects the n - j documents with s_i >= tau (ties give zero-length
    intervals, which are never drawn).
    """
    edges = np.concatenate([[0.0], np.sort(scores01), [1.0]])
    counts = scores01.size - np.arange(scores01.size + 1)
    return edges[:-1], np.diff(edges), counts


def _dp_threshold(
    scores: np.typing.ArrayLike,
    utilities_of_counts,
    epsilon: float,
    rng: np.random.Generator,
    score_range: ScoreRange,
) -> float:
    """tau drawn by the exponential mechanism over the intervals of the normalised scores."""
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    normalised = score_range.normalise(scores)
    left, lengths, counts = _intervals(normalised)
    keep = lengths > 0  # the lengths sum to 1, so some interval is kept
    # exp(eps * u / 2) * length == exp(eps * (u + 2 ln(length) / eps) / 2)
    utilities = utilities_of_counts(normalised, counts)[keep]
    folded = utilities + 2.0 * np.log(lengths[keep]) / epsilon
    j = exponential_mechanism(folded, epsilon=epsilon, sensitivity=1.0, rng=rng)
    return float(left[keep][j] + lengths[keep][j] * (1.0 - rng.random()))


def threshold_distribution(
    scores01: np.typing.ArrayLike, utilities_of_counts, epsilon: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left ends, lengths, probabilities) of the threshold's intervals: the closed form."""
    scores = np.asarray(scores01, dtype=np.float64)
    left, lengths, counts = _intervals(scores)
    utilities = utilities_of_counts(scores, counts)
    with np.errstate(divide="ignore"):
        logits = epsilon * utilities / 2.0 + np.log(lengths)
    weights = np.exp(logits - np.max(logits))
    return left, lengths, weights / weights.sum()


def _top_p_utilities(p: float, concentration: float):
    def utilities(scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
        weights = np.sort(np.exp(concentration * (scores - 1.0)))  # in (0, 1], ascending
        # selected weight of the interval with count c: the c largest weights
        selected = np.concatenate([[0.0], np.cumsum(weights[::-1])])[counts]
        return -np.abs(selected - p * weights.sum())

    return utilities


def dp_top_k_threshold(
    scores: np.typing.ArrayLike,
    k: int,
    epsilon: float,
    rng: np.random.Generator,
    *,
    score_range: ScoreRange = ScoreRange(),
) -> float:
    """A DP threshold tau in [0, 1] that selects about `k` documents (those with s >= tau).

    Args:
      scores: similarity of the question to every document of the private collection
        (raw; clipped to `score_range` and mapped to [0, 1] here).
      k: how many documents the threshold should select (k >= 1).
      epsilon, rng: the threshold's epsilon and randomness (`secure_rng()` in production).
      score_range: public clipping range of the raw scores.

    Returns:
      tau on the normalised [0, 1] scale; select with `select(scores, tau, score_range)`.

    Privacy:
      Privacy unit: one document (add/remove-one). Adding or removing a document changes
      #{i : s_i >= tau} by at most 1 for every tau, so the utility has sensitivity 1 and
      the continuous exponential mechanism on [0, 1] (Lebesgue base measure) is
      epsilon-DP, and epsilon-bounded-range (McSherry & Talwar 2007; Grislain 2024, "RAG
      with differential privacy", Sec. 3). Account with `pure_epsilon_event(epsilon)`.
      Scores are clipped to a public range, never to one read from the data.
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k=}")
    k = int(k)

    def utilities(_: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return -np.abs(counts - k).astype(np.float64)

    return _dp_threshold(scores, utilities, epsilon, rng, score_range)


def dp_top_p_threshold(
    scores: np.typing.ArrayLike,
    p: float,
    epsilon: float,
    rng: np.random.Generator,
    *,
    concentration: float = 5.0,
    score_range: ScoreRange = ScoreRange(),
) -> float:
    """A DP threshold that selects the documents holding a share `p` of the score weight.

    Each document weighs w_i = exp(concentration * (s_i - 1)) on the normalised scale, so
    high scores dominate; the utility of tau is ``-|sum_{s_i >= tau} w_i - p * sum_i w_i|``.

    Args:
      scores: similarity of the question to every private document (raw).
      p: share of the total weight to select, in (0, 1).
      epsilon, rng: the threshold's epsilon and randomness.
      concentration: public weighting of high scores (Grislain's top_p_alpha).
      score_range: public clipping range of the raw scores.

    Returns:
      tau on the normalised [0, 1] scale.

    Privacy:
      Privacy unit: one document (add/remove-one). A document of weight w in (0, 1]
      changes the utility by w * (1[s >= tau] - p), at most max(p, 1 - p) <= 1, so the
      exponential mechanism with sensitivity 1 is epsilon-DP (Grislain 2024, top-p
      variant). Account with `pure_epsilon_event(epsilon)`.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p=}")
    if not (math.isfinite(concentration) and concentration >= 0):
        raise ValueError(f"concentration must be >= 0, got {concentration=}")
    utilities = _top_p_utilities(float(p), float(concentration))
    return _dp_threshold(scores, utilities, epsilon, rng, score_range)


def best_selected(
    scores: np.typing.ArrayLike,
    tau: float,
    rows: int,
    score_range: ScoreRange = ScoreRange(),
    eligible: np.typing.ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best `rows` selected documents at a fixed shape (private; for the answer stage).

    `eligible` (default: all) masks documents out of the selection whatever their score
    (individual accounting's exhausted documents, `retriever.rag.individual`).

    Returns:
      (indices [rows], weights [rows], selected [N]): the `rows` best-scored documents with
      normalised score >= tau, best first, padded with weight-0 entries; and the mask of
      all selected documents. The work (a partition over all N scores, a sort of `rows`)
      does not tell how many documents the threshold selected.

    Privacy: given the released tau, adding or removing one document adds or removes one
    row, or, when the cap binds, swaps one row for another (the sensitivity of
    `aggregation.dp_icl_token(capped=True)` and of `keyword_vote`'s group step).
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows=}")
    normalised = score_range.normalise(scores)
    selected = normalised >= tau
    if eligible is not None:
        eligible = np.asarray(eligible, dtype=bool)
        if eligible.shape != normalised.shape:
            raise ValueError(f"eligible needs one entry per score: {eligible.shape=}")
        selected &= eligible
    keyed = np.where(selected, normalised, -np.inf)
    # A total order, (score desc, position asc), so whether a document makes the rows
    # depends on the documents ranked above it only: with ties (scores clipped at the
    # range's ends, duplicate texts) a partition's arbitrary pick would let a document
    # outside the rows decide which tied documents are in them.
    if keyed.size > rows:
        kth = np.partition(-keyed, rows - 1)[rows - 1]  # minus the rows-th largest value
        above = np.flatnonzero(-keyed < kth)
        tied = np.flatnonzero(-keyed == kth)[: rows - above.size]
        candidates = np.concatenate([above, tied])
    else:
        candidates = np.arange(keyed.size)
    order = candidates[np.lexsort((candidates, -keyed[candidates]))]
    weights = np.isfinite(keyed[order]).astype(np.float64)
    missing = rows - order.size  # a collection smaller than the rows: padding entries
    order = np.concatenate([order, np.zeros(missing, order.dtype)])
    weights = np.concatenate([weights, np.zeros(missing)])
    return order, weights, selected


def select(
    scores: np.typing.ArrayLike, tau: float, score_range: ScoreRange = ScoreRange()
) -> np.ndarray:
    """Indices of the documents with normalised score >= tau, best first (private set)."""
    normalised = score_range.normalise(scores)
    chosen = np.flatnonzero(normalised >= tau)
    return chosen[np.argsort(-normalised[chosen], kind="stable")]


def grouped_selected(
    scores: np.typing.ArrayLike,
    tau: float,
    buckets: np.typing.ArrayLike,
    groups: int,
    per_group: int,
    score_range: ScoreRange = ScoreRange(),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The selected documents in `groups` disjoint groups of at most `per_group` (private;
    for voters that each read several documents).

    A document's group is its public bucket (`buckets[i]` in [0, groups), a function of
    the document alone, e.g. a hash of its id); each group holds its bucket's best
    `per_group` selected documents (score desc, position asc).

    Returns:
      (indices [groups, per_group], -1 for an empty place; weights [groups], 1 for a
      group holding a document; selected [N]). The work is a sort of all N documents.

    Privacy: given the released tau, adding or removing one document changes its bucket's
    group only (possibly displacing or restoring one document of it): the one-row swap the
    voters' mechanisms are calibrated for.
    """
    if groups < 1 or per_group < 1:
        raise ValueError(f"groups and per_group must be >= 1, got {groups=}, {per_group=}")
    normalised = score_range.normalise(scores)
    buckets = np.asarray(buckets, dtype=np.int64)
    if buckets.shape != normalised.shape or (
        buckets.size and not 0 <= buckets.min() <= buckets.max() < groups
    ):
        raise ValueError(f"need one bucket in [0, {groups}) per score: {buckets.shape=}")
    selected = normalised >= tau
    keyed = np.where(selected, normalised, -np.inf)
    positions = np.arange(keyed.size)
    order = np.lexsort((positions, -keyed, buckets))  # bucket, then score desc, position
    sorted_buckets = buckets[order]
    first = np.searchsorted(sorted_buckets, sorted_buckets, side="left")
    rank = positions - first  # place within the bucket
    keep = (rank < per_group) & selected[order]
    indices = np.full((groups, per_group), -1, dtype=np.int64)
    indices[sorted_buckets[keep], rank[keep]] = order[keep]
    weights = (indices[:, 0] >= 0).astype(np.float64)
    return indices, weights, selected

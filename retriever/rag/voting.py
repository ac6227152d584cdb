"""DPVoteRAG and DPSparseVoteRAG token release (Koga, Wu & Chaudhuri 2024).

Each privately selected document is one voter, up to a public maximum of voters (the best
scored ones; Koga et al. 2024, Sec. 5, run one document per voter): a voter votes for its
greedy next token given its own document and the answer so far. The token is released by
LimitedDomain top-1 (Durfee & Rogers 2019, `synthgen.privacy.limited_domain_top1`) with
k_bar equal to the voters' maximum; its bottom symbol means the voters do not agree enough
to say anything (the answer abstains if that is its first release, and otherwise goes on
with the public LM's token). The sparse variant first asks, through the sparse vector
technique, whether enough voters disagree with the token the LM would emit with no
documents at all; only then does it pay for a LimitedDomain release, and otherwise emits
the public token for free. `vote_threshold` states, from public parameters only, how many
agreeing votes a release needs, so an operator sees when a release is impossible.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from retriever.rag.text import clean_answer_text
from synthgen.privacy import AboveThreshold, limited_domain_top1


def vote_counts(
    voter_logprobs: np.ndarray, vocab_size: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Histogram over the vocabulary of the voters' greedy tokens, shape [V].

    `weights` (0 or 1 per row; default all 1) leaves padding rows out of the count.
    """
    rows = np.asarray(voter_logprobs).reshape(-1, vocab_size)
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (rows.shape[0],) or not np.all((weights == 0) | (weights == 1)):
            raise ValueError(f"weights must be 0 or 1, one per row: {weights.shape=}")
    greedy = np.argmax(rows, axis=1)
    return np.bincount(greedy, weights=weights, minlength=vocab_size).astype(np.float64)


def _per_vote_parameters(epsilon: float, delta: float) -> tuple[float, float]:
    """(epsilon', delta') for LimitedDomain so a changed vote costs (epsilon, delta).

    A changed vote removes one vote and adds another: two add/remove steps, so group
    privacy of (epsilon', delta') gives (2 epsilon', (1 + e^epsilon') delta').
    """
    half = epsilon / 2.0
    return half, delta / (1.0 + math.exp(half))


def vote_threshold(epsilon: float, delta: float) -> float:
    """Votes the top token needs to beat LimitedDomain's threshold without noise.

    The threshold of `dp_vote_token` when at most k_bar tokens have votes: 1 +
    ln(1 / delta') / epsilon' at its per-vote parameters (both Gumbel draws at their mode).
    With fewer agreeing voters than this a release is unlikely (public arithmetic only).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    eps, dlt = _per_vote_parameters(epsilon, delta)
    return 1.0 + math.log(1.0 / dlt) / eps


def dp_vote_token(
    counts: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    max_candidates: int,
    rng: np.random.Generator,
) -> int | None:
    """Releases the voters' top token, or None (the answer ends).

    Args:
      counts: votes per vocabulary token (one vote per non-empty voter).
      epsilon: this token's privacy parameter.
      delta: this token's delta.
      max_candidates: LimitedDomain's k_bar (how many top counts it looks at).
      rng: source of randomness.

    Returns:
      A token id, or None (the bottom symbol: not enough agreement to release a token).

    Privacy:
      Privacy unit: one document (add/remove-one), given the released threshold. A document
      is one voter, so it adds or removes one vote; when the public cap on voters binds, it
      also displaces the last voter: at most one count -1 and another +1. LimitedDomain
      top-1 is run at (epsilon / 2, delta / (1 + e^(epsilon/2))) under add/remove of one
      vote (l0 = 1), hence (epsilon, delta)-DP for a changed vote (group privacy of size 2).
      Durfee & Rogers 2019, Alg. 1; Koga et al. 2024, DPVoteRAG.
      Account with `epsilon_delta_event(epsilon, delta)`; None still costs the charge.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    eps, dlt = _per_vote_parameters(epsilon, delta)
    return limited_domain_top1(
        counts,
        epsilon=eps,
        delta=dlt,
        max_candidates=max_candidates,
        max_contributions=1,
        rng=rng,
    )


def answer_key(text: str) -> str:
    """The form an answer is counted and released under: readable text, whitespace
    collapsed, trailing punctuation dropped ("Besox fever." and "Besox fever" agree)."""
    return clean_answer_text(text).rstrip(" .,;:!?")


def dp_answer_vote(
    answers: Sequence[str],
    *,
    epsilon: float,
    delta: float,
    max_candidates: int,
    rng: np.random.Generator,
) -> str | None:
    """Releases the voters' most common whole answer (its `answer_key`), or None.

    Args:
      answers: each voter's own greedy answer (one voter per document).
      epsilon: the release's privacy parameter.
      delta: its delta.
      max_candidates: LimitedDomain's k_bar (the voters' cap).
      rng: source of randomness.

    Returns:
      The winning answer key, or None (the bottom symbol: the voters do not agree enough).

    Privacy:
      Privacy unit: one document (add/remove-one), given the released threshold. Each
      voter's answer depends on its own document only, so a document adds or removes one
      vote, or swaps one when the voters' cap binds: one count -1 and another +1 over the
      (unbounded) domain of answer strings. LimitedDomain top-1 needs only the top k_bar + 1
      counts of such a domain (Durfee & Rogers 2019, the unknown-domain setting) and runs,
      as in `dp_vote_token`, at (epsilon / 2, delta / (1 + e^(epsilon/2))) per vote, so
      the release is (epsilon, delta)-DP. One release per answer, instead of one per token
      (Wu et al. 2024, DP-ICL keyword-space aggregation; Koga et al. 2024 vote per token).
    """
    keys = [answer_key(a) for a in answers]
    keys = [k for k in keys if k]  # an empty answer is no vote
    if not keys:
        keys_seen, counts = [], np.zeros(1)
    else:
        keys_seen = sorted(set(keys))  # a fixed order: ties broken by the answer text
        index = {k: i for i, k in enumerate(keys_seen)}
        counts = np.bincount([index[k] for k in keys], minlength=len(keys_seen)).astype(float)
    winner = dp_vote_token(
        counts, epsilon=epsilon, delta=delta, max_candidates=max_candidates, rng=rng
    )
    return None if winner is None or not keys_seen else keys_seen[winner]


@dataclasses.dataclass
class SparseVoteGate:
    """DPSparseVoteRAG: pays only for tokens where the voters overrule the public LM.

    The threshold is a public share of the public maximum of voters (half, as Koga et al.
    2024 run it). Each token asks an AboveThreshold instance whether the number of non-empty voters
    that disagree with the public token reaches `threshold`. Below: the public token is
    emitted, free. Above: the instance halts (it costs `gate_epsilon`), the token is
    released by `dp_vote_token` at (`token_epsilon`, `token_delta`), and a fresh instance
    starts. At most `max_releases` paid tokens per answer; after that the public LM's tokens
    continue the answer for free.

    Privacy:
      Privacy unit: one document (add/remove-one), given the released threshold. The disagreement
      count has sensitivity 1 (one voter changes). AboveThreshold is gate_epsilon-DP up to
      its first positive answer and gate_epsilon / 2-DP while it has answered only
      negatives (the threshold's Laplace share; Lyu, Su & Li 2017, Sec. 3), so an answer
      with r releases and an open instance costs r * gate_epsilon (+ gate_epsilon / 2) in
      pure DP plus r LimitedDomain releases (Koga et al. 2024, DPSparseVoteRAG). `charges`
      lists exactly these realized events (pay what you use); the answer's plan reserves
      the worst case (`max_releases` of each) before any noise is drawn.
    """

    threshold: float
    gate_epsilon: float
    token_epsilon: float
    token_delta: float
    max_candidates: int
    max_releases: int
    rng: np.random.Generator
    releases: int = 0
    _gate: AboveThreshold | None = None
    _open_queries: int = 0

    def _fresh(self) -> AboveThreshold:
        return AboveThreshold(
            self.threshold, epsilon=self.gate_epsilon, sensitivity=1.0, rng=self.rng
        )

    @property
    def exhausted(self) -> bool:
        return self.releases >= self.max_releases

    def step(self, counts: np.ndarray, public_token: int) -> tuple[int | None, bool]:
        """(token or None, paid) for one position of the answer."""
        if self.exhausted:
            raise RuntimeError("the gate has spent its max_releases; continue with public tokens")
        if self._gate is None:
            self._gate = self._fresh()
        disagree = float(counts.sum() - counts[public_token])
        self._open_queries += 1
        if not self._gate.test(disagree):
            return public_token, False
        self.releases += 1
        self._gate, self._open_queries = None, 0
        token = dp_vote_token(
            counts,
            epsilon=self.token_epsilon,
            delta=self.token_delta,
            max_candidates=self.max_candidates,
            rng=self.rng,
        )
        return token, True

    def charges(self) -> dict[str, tuple[float, float, int]]:
        """Realized spend per stage: {stage: (epsilon, delta, count)} of identical events."""
        out = {}
        if self.releases:
            out["gate"] = (self.gate_epsilon, 0.0, self.releases)
            out["tokens"] = (self.token_epsilon, self.token_delta, self.releases)
        if self._open_queries:
            out["gate-open"] = (self.gate_epsilon / 2.0, 0.0, 1)
        return out

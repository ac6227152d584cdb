"""DPVoteRAG and DPSparseVoteRAG token release (Koga, Wu & Chaudhuri 2024).

Voters hold disjoint partitions of the privately selected documents; each votes for its
greedy next token given its own documents and the answer so far. The token is released by
LimitedDomain top-1 (Durfee & Rogers 2019, `synthgen.privacy.limited_domain_top1`), whose
bottom symbol ends the answer. The sparse variant first asks, through the sparse vector
technique, whether enough voters disagree with the token the LM would emit with no
documents at all; only then does it pay for a LimitedDomain release, and otherwise emits
the public token for free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from synthgen.privacy import AboveThreshold, limited_domain_top1


def partition(doc_ids: list[str], num_voters: int, salt: bytes) -> list[list[int]]:
    """Positions of `doc_ids` per voter, by a salted hash of each document's own id.

    A document's voter depends only on its id and the (secret, per-answer) salt, so adding
    or removing one document changes one voter's partition and no other.
    """
    if num_voters < 1:
        raise ValueError(f"num_voters must be >= 1, got {num_voters=}")
    groups: list[list[int]] = [[] for _ in range(num_voters)]
    for position, doc_id in enumerate(doc_ids):
        digest = hashlib.blake2b(doc_id.encode(), key=salt, digest_size=8).digest()
        groups[int.from_bytes(digest, "little") % num_voters].append(position)
    return groups


def vote_counts(voter_logprobs: np.ndarray, vocab_size: int) -> np.ndarray:
    """Histogram over the vocabulary of the voters' greedy tokens, shape [V]."""
    rows = np.asarray(voter_logprobs).reshape(-1, vocab_size)
    return np.bincount(np.argmax(rows, axis=1), minlength=vocab_size).astype(np.float64)


def _per_vote_parameters(epsilon: float, delta: float) -> tuple[float, float]:
    """(epsilon', delta') for LimitedDomain so a changed vote costs (epsilon, delta).

    A changed vote removes one vote and adds another: two add/remove steps, so group
    privacy of (epsilon', delta') gives (2 epsilon', (1 + e^epsilon') delta').
    """
    half = epsilon / 2.0
    return half, delta / (1.0 + math.exp(half))


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
      A token id, or None.

    Privacy:
      Privacy unit: one document (add/remove-one), given the released threshold. A document
      belongs to one voter (`partition`), so it changes at most one vote: one count -1 and
      another +1. LimitedDomain top-1 is run at (epsilon / 2, delta / (1 + e^(epsilon/2)))
      under add/remove of one vote (l0 = 1), hence (epsilon, delta)-DP for a changed vote
      (group privacy of size 2). Durfee & Rogers 2019, Alg. 1; Koga et al. 2024, DPVoteRAG.
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


@dataclasses.dataclass
class SparseVoteGate:
    """DPSparseVoteRAG: pays only for tokens where the voters overrule the public LM.

    Each token asks an AboveThreshold instance whether the number of non-empty voters
    that disagree with the public token reaches `threshold`. Below: the public token is
    emitted, free. Above: the instance halts (it costs `gate_epsilon`), the token is
    released by `dp_vote_token` at (`token_epsilon`, `token_delta`), and a fresh instance
    starts. At most `max_releases` paid tokens per answer; after that the answer ends.

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
            raise RuntimeError("the gate has spent its max_releases; end the answer")
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

"""How one answer's (epsilon, delta) is split between retrieval, tokens and score.

A tenant asks for an answer at a per-answer target epsilon (delta is the stage's public
config). The plan gives a public share to the retrieval threshold and, when asked, to the
Laplace score release, and calibrates the per-token parameters so that the worst case of
the whole answer composes (PLD, `synthgen.privacy.accounting`) to at most the target. The
worst case is what the ledger checks before any noise is drawn; `stage_events` lists it
per stage, which is also what ICL and vote answers are charged (every planned token is
paid). Sparse-vote answers are charged their realized gate releases instead
(`retriever.rag.voting.SparseVoteGate`).

Under individual (per-document) accounting the retrieval is a public relevance threshold
(retrieval share 0: no retrieval stage) and each document that pays is charged the plan's
zCDP rho (`AnswerPlan.document_rho`): only mechanisms with a zCDP curve qualify.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from dp_accounting import dp_event

from retriever.rag.accounting import bounded_range_epsilon, calibrate_token_epsilon
from retriever.rag.keyword_vote import keyword_threshold
from retriever.rag.voting import vote_threshold
from synthgen.privacy import accounting
from synthgen.privacy.individual import bounded_range_rho, pure_rho

MECHANISMS = ("icl", "vote", "sparse-vote", "answer-vote", "keywords", "facts")
COMPOSITIONS = ("pure", "bounded-range")


def _largest(feasible: Callable[[float], bool], high: float, iterations: int = 40) -> float:
    """Largest x in (0, high] with feasible(x), by bisection (feasible is monotone)."""
    low = 0.0
    if feasible(high):
        return high
    for _ in range(iterations):
        mid = (low + high) / 2.0
        low, high = (mid, high) if feasible(mid) else (low, mid)
    if low == 0.0:
        raise ValueError("the per-answer epsilon is too small for this plan")
    return low


@dataclasses.dataclass(frozen=True)
class AnswerPlan:
    """Public parameters of one answer's mechanisms and its worst-case charge.

    Attributes:
      mechanism: "icl", "vote", "sparse-vote", "answer-vote" or "keywords".
      epsilon: the per-answer target.
      delta: the per-answer delta.
      max_tokens: most answer tokens.
      retrieval_epsilon: the threshold's epsilon.
      score_epsilon: the Laplace score release's epsilon (0: no score).
      token_epsilon: per released token (icl: exponential mechanism; vote/sparse:
        LimitedDomain).
      token_delta: per released token (vote/sparse; 0 for icl).
      gate_epsilon: per AboveThreshold instance (sparse only).
      max_releases: paid tokens at most (sparse: the gate's cap; answer-vote and keywords:
        1, the whole answer; otherwise max_tokens).
      composition: "pure" or "bounded-range" (icl tokens).
    """

    mechanism: str
    epsilon: float
    delta: float
    max_tokens: int
    retrieval_epsilon: float
    score_epsilon: float
    token_epsilon: float
    token_delta: float = 0.0
    gate_epsilon: float = 0.0
    max_releases: int = 0
    composition: str = "pure"

    def token_block_event(self, releases: int) -> dp_event.DpEvent:
        """The event of `releases` token releases."""
        if self.mechanism == "icl":
            if self.composition == "bounded-range":
                eps = bounded_range_epsilon(self.token_epsilon, releases, self.delta / 2)
                return accounting.epsilon_delta_event(eps, self.delta / 2)
            return accounting.self_composed(
                accounting.pure_epsilon_event(self.token_epsilon), releases
            )
        return accounting.self_composed(
            accounting.epsilon_delta_event(self.token_epsilon, self.token_delta), releases
        )

    def stage_events(self) -> list[tuple[str, dp_event.DpEvent]]:
        """(stage, event) of the worst case, in release order (no retrieval stage when the
        retrieval is public: individual accounting)."""
        events = []
        if self.retrieval_epsilon > 0:
            events.append(("retrieval", accounting.pure_epsilon_event(self.retrieval_epsilon)))
        if self.mechanism == "sparse-vote":
            gate = accounting.pure_epsilon_event(self.gate_epsilon)
            events.append(("gate", accounting.self_composed(gate, self.max_releases)))
        events.append(("tokens", self.token_block_event(self.max_releases)))
        if self.score_epsilon > 0:
            events.append(("score", accounting.laplace_event(self.score_epsilon)))
        return events

    def document_rho(self) -> float:
        """The zCDP rho one answer charges each document that pays for it (individual mode).

        Raises:
          ValueError: the plan has a stage without a zCDP curve: a DP retrieval threshold
            (individual mode retrieves by a public relevance threshold instead), or vote /
            sparse-vote / answer-vote tokens (LimitedDomain is (epsilon, delta)-DP with no
            zCDP or RDP curve, and a per-document filter admits only such curves).

        Privacy:
          A paying document's loss in one answer: every icl token is the exponential
          mechanism at `token_epsilon`, which is `token_epsilon`-bounded-range and so
          `token_epsilon**2 / 8`-zCDP (Cesar & Rogers 2021); the Laplace score is pure
          `score_epsilon`-DP, `score_epsilon**2 / 2`-zCDP (Bun & Steinke 2016). zCDP adds
          up over the answer's releases, all paid (`max_releases` tokens).
        """
        if self.mechanism != "icl":
            raise ValueError(
                f"per-document accounting answers with icl only: {self.mechanism} releases "
                "an (epsilon, delta)-DP event (LimitedDomain tokens, or keywords' partition "
                "selection) with no zCDP curve, which a per-document filter cannot take"
            )
        if self.retrieval_epsilon > 0:
            raise ValueError(
                "per-document accounting retrieves by a public relevance threshold: the "
                "plan's retrieval share must be 0"
            )
        rho = self.max_releases * bounded_range_rho(self.token_epsilon)
        if self.score_epsilon > 0:
            rho += pure_rho(self.score_epsilon)
        return rho

    def worst_case_event(self) -> dp_event.DpEvent:
        return accounting.compose([event for _, event in self.stage_events()])

    def worst_case_epsilon(self) -> float:
        return accounting.epsilon(self.worst_case_event(), self.delta)

    def vote_summary(
        self, voters: int, gate_share: float = 0.5, max_keywords: int = 1
    ) -> dict[str, float | int | bool]:
        """What a vote / sparse-vote plan implies for `voters` voters (public arithmetic).

        `limited_domain_threshold` is how many agreeing votes a token release needs
        (`retriever.rag.voting.vote_threshold`; keywords: the votes a keyword needs to clear
        the partition selection, `keyword_vote.keyword_threshold`, with
        `max_keywords` per voter); when it exceeds `voters` a release is
        practically impossible and every answer abstains. `gate_threshold` is how many
        voters must disagree with the public LM before sparse-vote pays for a release.
        """
        if self.mechanism == "icl":
            raise ValueError("vote_summary is for vote and sparse-vote plans")
        if voters < 1:
            raise ValueError(f"voters must be >= 1, got {voters=}")
        if self.mechanism in ("keywords", "facts"):  # PipelineDP's partition selection threshold
            threshold = keyword_threshold(self.token_epsilon, self.token_delta, max_keywords)
        else:
            threshold = vote_threshold(self.token_epsilon, self.token_delta)
        out = dict(
            mechanism=self.mechanism,
            epsilon=self.worst_case_epsilon(),
            target_epsilon=self.epsilon,
            delta=self.delta,
            tokens=self.max_tokens,
            retrieval_epsilon=self.retrieval_epsilon,
            token_epsilon=self.token_epsilon,
            token_delta=self.token_delta,
            max_releases=self.max_releases,
            voters=int(voters),
            limited_domain_threshold=threshold,
            release_possible=threshold <= voters,
        )
        if self.mechanism in ("keywords", "facts"):
            out.update(max_keywords=int(max_keywords), keyword_threshold=threshold)
        if self.mechanism == "sparse-vote":
            out.update(gate_epsilon=self.gate_epsilon, gate_threshold=gate_share * voters)
        return out


def make_plan(
    mechanism: str,
    epsilon: float,
    *,
    delta: float,
    max_tokens: int,
    retrieval_share: float = 0.1,
    score_share: float = 0.0,
    composition: str = "pure",
    max_releases: int = 6,
) -> AnswerPlan:
    """Splits a per-answer `epsilon` into the answer's mechanisms' parameters.

    Args:
      mechanism: "icl", "vote", "sparse-vote", "answer-vote" or "keywords".
      epsilon: per-answer target epsilon.
      delta: per-answer delta.
      max_tokens: most answer tokens.
      retrieval_share: share of epsilon for the DP threshold (0: a public threshold, no
        retrieval stage; individual accounting).
      score_share: share of epsilon for the Laplace score (0: no score).
      composition: icl tokens: "pure" (PLD of pure events; Grislain 2024) or
        "bounded-range" (Dong, Durfee & Rogers 2020), which allows a larger token epsilon.
      max_releases: sparse-vote: most paid tokens per answer.

    Returns:
      The plan; its worst case composes to at most `epsilon` at `delta`.

    Privacy:
      Privacy unit: one document (add/remove-one). Each (epsilon, delta) event carries its
      own delta share (vote: delta / (2 T) per token; bounded-range icl: delta / 2), and a
      ledger scope composes them at its delta cap, so a scope with cap delta_cap holds
      at most about 2 * delta_cap / delta such answers before it refuses every answer.

    Raises:
      ValueError: a bad parameter, or a target too small to split.
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism=}")
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition=}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    if max_tokens < 1 or max_releases < 1:
        raise ValueError(f"max_tokens and max_releases must be >= 1, got {max_tokens=}")
    if not (0 <= retrieval_share < 1 and 0 <= score_share < 1 - retrieval_share):
        raise ValueError(f"shares must leave room for tokens, got {retrieval_share=}")
    retrieval = retrieval_share * epsilon
    score = score_share * epsilon
    base = dict(
        mechanism=mechanism,
        epsilon=float(epsilon),
        delta=float(delta),
        max_tokens=int(max_tokens),
        retrieval_epsilon=retrieval,
        score_epsilon=score,
        composition=composition,
    )
    if mechanism == "icl":
        token = calibrate_token_epsilon(
            epsilon,
            max_tokens,
            delta if composition == "pure" else delta / 2,
            retrieval_epsilon=retrieval,
            extra_pure=(score,) if score > 0 else (),
            composition=composition,
        )

        # the calibration may use basic composition where discretised PLD is looser; the
        # ledger composes with PLD, so shrink until the PLD worst case is within the target
        def icl_plan(x: float) -> AnswerPlan:
            return AnswerPlan(**base, token_epsilon=x, max_releases=max_tokens)

        return icl_plan(_largest(lambda x: icl_plan(x).worst_case_epsilon() <= epsilon, token))
    # answer-vote, keywords and facts: one release per answer (whole answers; keywords; values)
    one = {"vote": max_tokens, "answer-vote": 1, "keywords": 1, "facts": 1}
    releases = one.get(mechanism, min(max_releases, max_tokens))
    token_delta = delta / (2 * releases)

    def plan_of(x: float) -> AnswerPlan:
        gate = x if mechanism == "sparse-vote" else 0.0
        return AnswerPlan(
            **base,
            token_epsilon=x,
            token_delta=token_delta,
            gate_epsilon=gate,
            max_releases=releases,
        )

    return plan_of(_largest(lambda x: plan_of(x).worst_case_epsilon() <= epsilon, epsilon))

"""How one answer's (epsilon, delta) is split between retrieval, tokens and score.

The plan gives public shares of the per-answer target epsilon to the retrieval threshold
and the optional Laplace score, and calibrates the per-token parameters so that the worst
case of the whole answer composes (PLD) to at most the target at the config's delta. The
ledger checks and charges that worst case (`stage_events`: icl pays every planned token,
keywords and facts one release) before any noise is drawn. Under individual accounting the
retrieval is a public relevance threshold (no retrieval stage) and each paying document is
charged the plan's zCDP rho (`AnswerPlan.document_rho`: icl only).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable

from dp_accounting import dp_event

from retriever.rag.accounting import COMPOSITIONS, bounded_range_epsilon, calibrate_token_epsilon
from retriever.rag.keyword_vote import keyword_threshold
from synthgen.privacy import accounting, calibration
from synthgen.privacy.individual import bounded_range_rho, pure_rho
from synthgen.privacy.partition_selection import selection_threshold

RELATION = "ADD_OR_REMOVE_ONE"  # every answer's neighbouring relation
SHAPE_FORMAT = 1

MECHANISMS = ("icl", "keywords", "facts")
# single-answer mechanisms retired by issue 69 (on the medical evaluation, 60 questions,
# vote answered at most 0.08 and sparse-vote 0.00 at every epsilon; answer-vote was probed on
# 10 questions only): refused by name, with what to use instead. Their charges in old
# ledgers still compose (a charge is an event, whatever released it).
RETIRED = ("vote", "sparse-vote", "answer-vote")


def _largest(feasible: Callable[[float], bool], high: float, iterations: int = 40) -> float:
    """Largest x in (0, high] with feasible(x), by bisection (feasible is monotone)."""
    if feasible(high):
        return high
    low = calibration.bisect(feasible, 0.0, high, iterations=iterations)
    if low == 0.0:
        raise ValueError("the per-answer epsilon is too small for this plan")
    return low


@dataclasses.dataclass(frozen=True)
class AnswerPlan:
    """Public parameters of one answer's mechanisms and its worst-case charge.

    A `synthgen.privacy.release_plan.ReleasePlan`: `event` (the worst case, composed from
    the charged `stage_events`) under `relation` at `delta` is at most `epsilon` (PLD).

    Attributes:
      mechanism: "icl", "keywords" or "facts".
      epsilon, delta: the per-answer target and delta.
      max_tokens: most answer tokens.
      retrieval_epsilon, score_epsilon: the threshold's and the Laplace score's (0: none).
      token_epsilon, token_delta: per release (icl: each token's exponential mechanism,
        delta 0; keywords and facts: the partition selection's).
      max_releases: paid releases per answer (icl: max_tokens; keywords and facts: 1).
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
        events.append(("tokens", self.token_block_event(self.max_releases)))
        if self.score_epsilon > 0:
            events.append(("score", accounting.laplace_event(self.score_epsilon)))
        return events

    def document_rho(self) -> float:
        """The zCDP rho one answer charges each document that pays for it (individual mode).

        Raises:
          ValueError: a stage without a zCDP curve, which a per-document filter cannot
            take: a DP retrieval threshold, or keywords' or facts' partition selection.

        Privacy:
          Each icl token is the exponential mechanism at `token_epsilon`, so
          `token_epsilon`-bounded-range and `token_epsilon**2 / 8`-zCDP (Cesar & Rogers
          2021); the Laplace score is `score_epsilon**2 / 2`-zCDP (Bun & Steinke 2016).
          zCDP adds up over the answer's releases, all paid (`max_releases` tokens).
        """
        if self.mechanism != "icl":
            raise ValueError(
                f"per-document accounting answers with icl only: {self.mechanism} releases "
                "an (epsilon, delta)-DP event (a partition selection) with no zCDP curve, "
                "which a per-document filter cannot take"
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

    @property
    def event(self) -> dp_event.DpEvent:
        """The answer's charged event: `worst_case_event()`."""
        return self.worst_case_event()

    @property
    def relation(self) -> accounting.NeighboringRelation:
        """Add/remove-one document: the relation the answer is charged under (`RELATION`)."""
        return accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

    def to_dict(self) -> dict:
        """The plan's public parameters and its charged event, as JSON-ready metadata."""
        return {
            **dataclasses.asdict(self),
            "unit": "one document",
            "neighboring_relation": self.relation.name,
            "accountant": "pld",
            "dp_event": json.loads(accounting.event_to_json(self.event)),
        }

    def worst_case_epsilon(self) -> float:
        return accounting.epsilon(self.worst_case_event(), self.delta)

    def vote_summary(self, voters: int, max_keywords: int = 1) -> dict[str, float | int | bool]:
        """What a keywords / facts plan implies for `voters` voters (public arithmetic).

        `keyword_threshold` (also `limited_domain_threshold`, the CLI JSON's old name) is
        how many votes a keyword or value needs to clear the partition selection; above
        `voters` a release is practically impossible and every answer abstains.
        """
        if self.mechanism == "icl":
            raise ValueError("vote_summary is for keywords and facts plans")
        if voters < 1:
            raise ValueError(f"voters must be >= 1, got {voters=}")
        # PipelineDP's partition selection threshold: keywords selects at the group
        # parameters (a document swaps a voter), facts at the release's own (every document
        # is a voter, `voters` is then the collection's size)
        if self.mechanism == "facts":
            threshold = selection_threshold(self.token_epsilon, self.token_delta, max_keywords)
        else:
            threshold = keyword_threshold(self.token_epsilon, self.token_delta, max_keywords)
        return dict(
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
            max_keywords=int(max_keywords),
            keyword_threshold=threshold,
        )


def retired_message(mechanism: str) -> str:
    """The one line that refuses a retired mechanism (`RETIRED`), naming what to use."""
    return (
        f"the {mechanism} mechanism was retired (it answered almost no question of the DP-RAG "
        "evaluation, docs/guides/dp_rag.md#retired-mechanisms): use facts (what auto "
        "resolves to), keywords or icl"
    )


def check_mechanism(mechanism: str, *, auto: bool = False) -> None:
    """Refuses a mechanism not in `MECHANISMS` (nor "auto" when `auto`).

    Raises:
      ValueError: a retired mechanism (`retired_message`) or an unknown one.
    """
    if mechanism in RETIRED:
        raise ValueError(retired_message(mechanism))
    known = ("auto", *MECHANISMS) if auto else MECHANISMS
    if mechanism not in known:
        raise ValueError(f"mechanism must be one of {known}, got {mechanism=}")


def make_plan(
    mechanism: str,
    epsilon: float,
    *,
    delta: float,
    max_tokens: int,
    retrieval_share: float = 0.1,
    score_share: float = 0.0,
    composition: str = "pure",
) -> AnswerPlan:
    """Splits a per-answer `epsilon` into the answer's mechanisms' parameters.

    Args:
      mechanism: "icl", "keywords" or "facts".
      epsilon, delta: the per-answer target epsilon and delta.
      max_tokens: most answer tokens.
      retrieval_share: share of epsilon for the DP threshold (0: a public threshold, no
        retrieval stage; individual accounting).
      score_share: share of epsilon for the Laplace score (0: no score).
      composition: icl tokens: "pure" (PLD of pure events; Grislain 2024) or
        "bounded-range" (Dong, Durfee & Rogers 2020), which allows a larger token epsilon.

    Returns:
      The plan; its worst case composes to at most `epsilon` at `delta`.

    Privacy:
      Privacy unit: one document (add/remove-one). Each (epsilon, delta) event (keywords'
      and facts' release, bounded-range icl) carries a delta / 2 share, and a scope
      composes them at its delta cap, so it holds at most about 2 * delta_cap / delta such
      answers before it refuses every answer.

    Raises:
      ValueError: a bad parameter, a retired mechanism, or a target too small to split.
    """
    check_mechanism(mechanism)
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition=}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon=}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens=}")
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
        high = calibrate_token_epsilon(
            epsilon,
            max_tokens,
            delta if composition == "pure" else delta / 2,
            retrieval_epsilon=retrieval,
            extra_pure=(score,) if score > 0 else (),
            composition=composition,
        )
        token_delta, releases = 0.0, max_tokens
    else:  # keywords and facts: one release per answer (the keywords; the values)
        high, token_delta, releases = epsilon, delta / 2, 1

    def plan_of(x: float) -> AnswerPlan:
        return AnswerPlan(**base, token_epsilon=x, token_delta=token_delta, max_releases=releases)

    # icl's calibration may use basic composition where discretised PLD is looser; the
    # ledger composes with PLD, so shrink until the PLD worst case is within the target
    return plan_of(_largest(lambda x: plan_of(x).worst_case_epsilon() <= epsilon, high))


def answer_event_shape(plan: AnswerPlan) -> str:
    """The canonical public description of an answer's event (what a collection pins).

    The plan's public inputs, which fix every stage's DP event: the mechanism, the
    per-answer (ε, δ), the most tokens and paid releases (derived; kept so that shapes
    pinned before vote, sparse-vote and answer-vote were retired stay byte-identical), the
    shares of ε, the icl composition and the relation. Parameters that change which
    documents or tokens are chosen but not the event (k, voters, score range) are left out.
    """
    shape = {
        "format": SHAPE_FORMAT,
        "kind": "rag-answer",
        "relation": RELATION,
        "mechanism": plan.mechanism,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "max_tokens": plan.max_tokens,
        "max_releases": plan.max_releases,
        # shares, not products: a differing epsilon is then named once
        "retrieval_share": round(plan.retrieval_epsilon / plan.epsilon, 12),
        "score_share": round(plan.score_epsilon / plan.epsilon, 12),
        "composition": plan.composition if plan.mechanism == "icl" else None,
    }
    return json.dumps(shape, sort_keys=True, separators=(",", ":"))

"""Public parameters of the DP-RAG answer stage (`RagConfig`) and the plan they imply."""

from __future__ import annotations

import dataclasses
import functools

from retriever.rag.aggregation import AggregationConfig
from retriever.rag.plan import AnswerPlan, make_plan
from retriever.rag.retrieval import ScoreRange

ACCOUNTING_MODES = ("collection", "individual")
# how documents are scored for a question: the index's dense encoder, or term overlap
RETRIEVALS = ("dense", "overlap")


@dataclasses.dataclass(frozen=True)
class RagConfig:
    """Public parameters of the answer stage.

    Attributes:
      k: documents the DP threshold aims to select (top-k); ignored when `top_p` is set.
      top_p: select a share of the score weight instead (Grislain's top-p variant).
      score_range: public clipping range of similarity scores.
      max_tokens: most answer tokens.
      delta: per-answer delta.
      retrieval_share, score_share: shares of the per-answer epsilon for the threshold
        and for the Laplace score release (0: none).
      composition: "pure" or "bounded-range" analysis of icl tokens.
      aggregation: alpha, clip and the public power beta of the icl aggregation.
      max_voters: the public cap on private prompts (icl's rows, keywords' voters), one
        selected document each, the best scored; fewer selected: padding rows. None: k.
      answer_keywords: K, most keywords one voter's answer contributes (each more raises
        the release threshold: 13.6 -> 19.2 votes at epsilon 5 for K = 1 -> 2).
      voter_tokens: keywords: how many tokens each voter's own answer decodes (public;
        longer than `max_tokens`: a small LM restates the question first).
      max_document_tokens: a document's text is cut to this many tokens in a prompt.
      accounting: "collection" (every answer is charged to the collection's cap) or
        "individual" (each document pays, through its own filter in the ledger, for the
        answers it takes part in: `synthgen.privacy.document_filters`; icl only).
      relevance_threshold: individual accounting: the public threshold tau on the
        normalised score scale [0, 1] (MuRAG), replacing the DP threshold: documents at
        or above it that their filter admits are used and pay, the others neither.
      participation: individual accounting: the public probability with which each
        active document takes part in an answer, by a coin drawn for it alone.
      documents_per_voter: keywords: each voter reads up to this many selected documents,
        a disjoint group chosen by a public hash of their ids (one document: one voter).
    """

    k: int = 16
    top_p: float | None = None
    score_range: ScoreRange = ScoreRange(0.0, 1.0)
    max_tokens: int = 12
    delta: float = 1e-6
    retrieval_share: float = 0.1
    score_share: float = 0.0
    composition: str = "pure"
    aggregation: AggregationConfig = AggregationConfig()
    max_voters: int | None = None
    answer_keywords: int = 1
    voter_tokens: int = 24
    max_document_tokens: int = 160
    accounting: str = "collection"
    relevance_threshold: float = 0.5
    participation: float = 1.0
    documents_per_voter: int = 1

    def __post_init__(self) -> None:
        if self.k < 1 or self.max_tokens < 1 or (self.max_voters or 1) < 1:
            raise ValueError(f"k, max_tokens and max_voters must be >= 1: {self=}")
        if self.top_p is not None and not 0 < self.top_p < 1:
            raise ValueError(f"top_p must be in (0, 1), got {self.top_p=}")
        if self.max_document_tokens < 1 or self.answer_keywords < 1 or self.voter_tokens < 1:
            raise ValueError(
                f"max_document_tokens, answer_keywords and voter_tokens must be >= 1: {self=}"
            )
        if self.accounting not in ACCOUNTING_MODES:
            raise ValueError(f"accounting must be one of {ACCOUNTING_MODES}: {self.accounting=}")
        if not 0.0 <= self.relevance_threshold <= 1.0:
            raise ValueError(f"relevance_threshold must be in [0, 1]: {self.relevance_threshold=}")
        if self.documents_per_voter < 1:
            raise ValueError(f"documents_per_voter must be >= 1: {self.documents_per_voter=}")
        if not 0.0 < self.participation <= 1.0:
            raise ValueError(f"participation must be in (0, 1]: {self.participation=}")
        if not self.individual and not 0.0 < self.retrieval_share < 1.0:
            # collection accounting draws a DP threshold: it needs a share of epsilon
            raise ValueError(f"retrieval_share must be in (0, 1): {self.retrieval_share=}")

    @property
    def individual(self) -> bool:
        """Whether documents pay individually (per-document filters)."""
        return self.accounting == "individual"

    @property
    def voters(self) -> int:
        """How many private prompts every answer holds, a public number: `max_voters`, or
        k over `documents_per_voter` (rounded up)."""
        return self.max_voters or -(-self.k // self.documents_per_voter)


@functools.lru_cache(maxsize=256)
def plan_answer(config: RagConfig, mechanism: str, epsilon: float) -> AnswerPlan:
    """The plan of one answer at per-answer `epsilon` under `config` (cached: pure)."""
    return make_plan(
        mechanism,
        epsilon,
        delta=config.delta,
        max_tokens=config.max_tokens,
        retrieval_share=0.0 if config.individual else config.retrieval_share,
        score_share=config.score_share,
        composition=config.composition,
    )

"""Keyword-conditioned DP few-shot documents: DP topics first, then one pool per topic.

Two DP stages over private documents, in the spirit of DP-SynRAG (Mori et al. 2025):

1. Topics: each document names at most `max_keywords` keywords by a public rule
   (`document_keywords`: its distinct words of 5+ letters outside a stop list, the ones the
   LM's tokenizer splits into the most tokens first, i.e. the rarest-looking); the Gaussian
   sparse histogram (`synthgen.privacy.sparse_histogram`) releases the keywords many
   documents share. Invented or rare words (a disease no LM knows) can be released; a word
   of one document is released with probability at most delta_t.
2. Documents: every released keyword is a pool holding the documents that name it (a
   document joins at most `pools_per_document` pools: its first released keywords in
   release order, a function of the document and the public release), and DP few-shot
   generation
   (`synthgen.fewshot.generate`) writes `per_topic` documents per pool, prompted with the
   keyword; the RVP candidates include the released keywords' tokens (public by then).

Privacy:
  Unit: one private document; add/remove-one. Stage 1 is `plan.topics.event`; stage 2 is
  the few-shot event of `per_topic * max_new_tokens` tokens per pool, charged
  `pools_per_document` times (the overlapping pools: `FewShotPlan.pools_per_example`). Both are
  fixed before any private row is read (the number of released keywords only decides how
  many pools run, not any pool's charge), checked together against the ledger, and
  charged before their noise is drawn. Pools smaller than the declared size run
  (`allow_small_pools`): the sampling rate q is per example, whatever the pool's size.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from synthgen.fewshot.config import FewShotConfig
from synthgen.fewshot.generation import generate
from synthgen.fewshot.plan import RELATION, FewShotPlan, plan_privacy
from synthgen.fewshot.prompts import PromptTemplate
from synthgen.privacy import accounting
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.sparse_histogram import (
    SparseHistogramPlan,
    gaussian_sparse_histogram,
    plan_sparse_histogram,
)

TOPIC_TEMPLATE = PromptTemplate(
    header='Here are records that mention "{label}".\n\n',
    shot="Record: {text}\n\n",
    stem="Record:",
)
# Common English words of 5+ letters that say nothing about a topic (public).
STOPWORDS = frozenset(
    """about above after again against along among another around because before being
    below between could during every first found given having however later might never
    other others their there these those three through under until where which while
    would years patient patients presented reported diagnosed diagnosis treated treatment
    prescribed record records year-old""".split()
)
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """Public parameters of a keyword-conditioned release.

    Attributes:
      epsilon: epsilon of the whole release (topics and documents composed).
      delta: its delta; half goes to each stage.
      topic_share: share of epsilon for the topics.
      max_keywords: most keywords per document in the topic histogram.
      pools_per_document: most topic pools a document joins (its first released keywords
        in release order, i.e. by descending noisy count); its tokens are charged that
        many times.
      max_topics: most released keywords used as pools (the highest noisy counts).
      per_topic: synthetic documents per topic.
      keyword_candidates: add the released keywords' tokens to the RVP candidates.
      fewshot: the generation's config without its privacy fields (`public_pool_size`,
        subsets, shots, max_new_tokens, public_vocab, ...); epsilon, delta, small pools
        and candidates are set here.
    """

    epsilon: float
    delta: float
    fewshot: FewShotConfig
    topic_share: float = 0.3
    max_keywords: int = 4
    pools_per_document: int = 1
    max_topics: int = 64
    per_topic: int = 1
    keyword_candidates: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0) or not 0 < self.delta < 1:
            raise ValueError(f"need epsilon > 0 and 0 < delta < 1: {self.epsilon=} {self.delta=}")
        if not 0 < self.topic_share < 1:
            raise ValueError(f"topic_share must be in (0, 1), got {self.topic_share=}")
        if min(self.max_keywords, self.max_topics, self.per_topic, self.pools_per_document) < 1:
            raise ValueError(f"max_keywords, max_topics, per_topic must be >= 1: {self=}")
        if self.pools_per_document > self.max_keywords:
            raise ValueError(f"pools_per_document must be <= max_keywords: {self=}")


@dataclasses.dataclass(frozen=True)
class TopicPlan:
    """Both stages' plans, fixed before any private row is read."""

    topics: SparseHistogramPlan
    fewshot: FewShotConfig
    documents: FewShotPlan
    epsilon: float
    delta: float

    @property
    def event(self):
        return accounting.compose([self.topics.event, self.documents.event])

    def to_dict(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "unit": "one private document",
            "neighboring_relation": RELATION,
            "accountant": "pld",
            "stages": [
                {"stage": "topics", **self.topics.to_dict()},
                {"stage": "documents", **self.documents.to_dict()},
            ],
        }


@dataclasses.dataclass
class TopicRelease:
    """The released documents, their topics and the released keyword counts (all DP)."""

    texts: list[str]
    topics: list[str]
    keyword_counts: dict[str, float]
    plan: TopicPlan
    tokens_released: int


def document_keywords(
    text: str, *, max_keywords: int, token_count: Callable[[str], int], min_chars: int = 5
) -> list[str]:
    """A document's keywords by a public rule: its distinct lowercase words of at least
    `min_chars` letters outside `STOPWORDS`, those with the most tokens first (ties: first
    seen), at most `max_keywords`. A function of the one document only."""
    words = dict.fromkeys(w.lower() for w in _WORD.findall(text))
    kept = [w for w in words if len(w) >= min_chars and w not in STOPWORDS]
    ranked = sorted(enumerate(kept), key=lambda iw: (-token_count(iw[1]), iw[0]))
    return [w for _, w in ranked[:max_keywords]]


def plan_topics(config: TopicConfig) -> TopicPlan:
    """Splits (epsilon, delta) between the stages and calibrates both (public figures only)."""
    half = config.delta / 2
    topics = plan_sparse_histogram(config.epsilon * config.topic_share, half, config.max_keywords)
    fewshot = dataclasses.replace(
        config.fewshot,
        target_epsilon=config.epsilon * (1 - config.topic_share),
        noise_multiplier=None,
        token_epsilon=None,
        delta=half,
        allow_small_pools=True,
    )
    tokens = config.per_topic * fewshot.max_new_tokens
    # delta is checked against the most pools a run can have (a public bound)
    documents = plan_privacy(fewshot, tokens, config.max_topics, config.pools_per_document)
    # NB: the config's noise is now fixed; later plans (one per run) reuse it.
    name = "noise_multiplier" if fewshot.mechanism == "gaussian" else "token_epsilon"
    fewshot = dataclasses.replace(
        fewshot,
        target_epsilon=None,
        **{name: documents.noise_multiplier or documents.token_epsilon},
    )
    event = accounting.compose([topics.event, documents.event])
    eps = accounting.epsilon(event, config.delta)
    return TopicPlan(topics, fewshot, documents, eps, config.delta)


def release_topic_documents(
    lm,
    texts: Sequence[str],
    config: TopicConfig,
    *,
    rng: np.random.Generator,
    ledger: PrivacyLedger | None = None,
    ledger_scope: tuple[str, str] | None = None,
    on_token: Callable[[int, FewShotPlan], None] | None = None,
) -> TopicRelease:
    """Releases keyword topics, then `per_topic` DP few-shot documents per topic.

    Args:
      lm: the frozen LM backend (its tokenizer also ranks keywords).
      texts: the private documents.
      config: public parameters.
      rng: the mechanisms' randomness (production: `secure_rng()`).
      ledger: charged both stages (checked together first).
      ledger_scope: (tenant, dataset) of the charges.
      on_token: progress callback of the generation.

    Returns:
      The release (no topic released: no document, only the topic stage charged).

    Privacy:
      (plan.epsilon, plan.delta)-DP for one private document under add/remove-one: see
      the module docstring.
    """
    plan = plan_topics(config)
    if ledger is not None:
        if ledger_scope is None:
            raise ValueError("ledger_scope=(tenant, dataset) is required with a ledger")
        ledger.check(*ledger_scope, stage="topic-release", event=plan.event, relation=RELATION)
    keywords = [
        document_keywords(
            t, max_keywords=config.max_keywords, token_count=lambda w: len(lm.encode(" " + w))
        )
        for t in texts
    ]
    if ledger is not None:
        ledger.charge(
            *ledger_scope,
            stage="topics",
            event=plan.topics.event,
            relation=RELATION,
            description=f"DP keyword topics (sparse histogram), eps={plan.topics.epsilon:.4g}",
        )
    topic_rng, doc_rng = rng.spawn(2)
    counts = gaussian_sparse_histogram(keywords, plan.topics, topic_rng)
    chosen = list(counts)[: config.max_topics]
    if not chosen:
        return TopicRelease([], [], counts, plan, 0)
    rank = {word: i for i, word in enumerate(chosen)}
    rows = [
        {"text": text, "label": word}
        for text, words in zip(texts, keywords)
        for word in sorted((w for w in words if w in rank), key=rank.get)[
            : config.pools_per_document
        ]
    ]
    targets = [{"label": word} for word in chosen for _ in range(config.per_topic)]
    extra = (
        sorted({t for word in chosen for t in lm.encode(" " + word) + lm.encode(word)})
        if config.keyword_candidates
        else []
    )
    fewshot = dataclasses.replace(plan.fewshot, extra_candidates=tuple(extra))
    doc_plan = plan_privacy(
        fewshot, config.per_topic * fewshot.max_new_tokens, config.max_topics,
        config.pools_per_document,
    )  # fmt: skip
    if doc_plan.event != plan.documents.event:  # the same charge as checked
        raise AssertionError("the document stage's plan changed after the check")
    result = generate(
        lm,
        rows,
        targets,
        TOPIC_TEMPLATE,
        fewshot,
        pool_field="label",
        rng=doc_rng,
        ledger=ledger,
        ledger_scope=ledger_scope,
        plan=doc_plan,
        on_token=on_token,
    )
    return TopicRelease(
        result.texts, [t["label"] for t in targets], counts, plan, result.tokens_released
    )

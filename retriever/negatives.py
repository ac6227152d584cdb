"""Hard negatives for dual-encoder training, mined from the public corpus with a public encoder.

For each training query the public encoder ranks the corpus; the hard negative is the
highest-ranked other document scoring below `max_relative_score` times the own document's
score, a cut that drops likely false negatives ("TopK-PercPos" of NV-Retriever, Moreira et
al. 2024, who found 0.95 best). `retriever.train.train_retriever` adds the batch's hard
negatives to its in-batch negatives. See docs/guides/retriever.md.

Privacy:
  Post-processing with public data only, when the queries are a DP release: the corpus is
  public and the mining encoder must be a public pretrained model (checked from its
  provenance, as for `retriever.consistency`). No budget is spent; an encoder trained on
  the mined pairs keeps the queries' guarantee.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

MINING_KIND = (
    "hard negatives: top-ranked below a share of the positive's score (Moreira et al. 2024)"
)


@dataclasses.dataclass(frozen=True)
class NegativeMining:
    """How hard negatives are mined.

    Args:
      encoder: a public pretrained encoder (asset, ``random:...`` or a folder recorded as
        pretrained).
      max_relative_score: a candidate must score below this share of the positive's score
        (false-negative filter; 1.0 keeps any document scoring below the positive); when
        the positive's score is not positive, a candidate must score below it.
      depth: candidates looked at per query (the top `depth` documents but the positive);
        a query with none left gets no hard negative (its column is masked out of the loss
        for every query).
      max_query_len, max_doc_len: token limits of the encoder's inputs.
    """

    encoder: str = "all-minilm-l6-v2"
    max_relative_score: float = 0.95
    depth: int = 30
    max_query_len: int = 32
    max_doc_len: int = 128

    def __post_init__(self) -> None:
        if not 0 < self.max_relative_score <= 1:
            raise ValueError(f"max_relative_score must be in (0, 1], got {self.max_relative_score}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth=}")


def pick_negatives(
    scores: np.ndarray, positives: np.ndarray, *, max_relative_score: float, depth: int
) -> np.ndarray:
    """Row of each query's hard negative in the corpus, or -1 where no candidate qualifies.

    Args:
      scores: [m, n] query-document scores (inner products of normalised embeddings).
      positives: [m] row of each query's own document.
      max_relative_score, depth: see `NegativeMining`.
    """
    m, n = scores.shape
    own = scores[np.arange(m), positives]
    masked = scores.copy()
    masked[np.arange(m), positives] = -np.inf
    top = min(depth, n - 1)
    if top < 1:
        return np.full(m, -1, np.int64)
    candidates = np.argpartition(-masked, top - 1, axis=1)[:, :top]
    cand_scores = np.take_along_axis(masked, candidates, axis=1)
    # r * own is below own only for a positive own score; otherwise "below the positive"
    cut = np.where(own > 0, max_relative_score * own, own)
    allowed = cand_scores < cut[:, None]
    cand_scores = np.where(allowed, cand_scores, -np.inf)
    best = np.argmax(cand_scores, axis=1)
    picked = candidates[np.arange(m), best]
    return np.where(np.isfinite(cand_scores[np.arange(m), best]), picked, -1)


def mine_hard_negatives(
    queries: Sequence[str],
    positive_ids: Sequence[str],
    doc_ids: Sequence[str],
    texts: Sequence[str],
    config: NegativeMining,
    *,
    progress: bool = False,
) -> tuple[list[str | None], dict]:
    """The doc_id of each query's hard negative (None where none qualifies), and the mining's
    public record (counts and settings, for the trained encoder's metadata).

    Raises:
      ValueError: a positive doc_id not in the corpus; an encoder that is not public.
    """
    from retriever.consistency import check_public_encoder
    from retriever.evaluate import encoder_label, load_towers

    check_public_encoder(config.encoder)
    position = {str(d): i for i, d in enumerate(doc_ids)}
    missing = {str(p) for p in positive_ids} - set(position)
    if missing:
        raise ValueError(f"{len(missing)} positive documents are not in the corpus")
    query_encoder, doc_encoder = load_towers(config.encoder)
    doc_emb = doc_encoder.encode(texts, max_len=config.max_doc_len, progress=progress)
    query_emb = query_encoder.encode(list(queries), max_len=config.max_query_len, progress=progress)
    positives = np.array([position[str(p)] for p in positive_ids], np.int64)
    picked = np.full(len(positives), -1, np.int64)
    chunk = max(1, (1 << 24) // max(len(doc_ids), 1))
    for start in range(0, len(positives), chunk):
        scores = np.asarray(query_emb[start : start + chunk], np.float32) @ doc_emb.T
        picked[start : start + chunk] = pick_negatives(
            scores,
            positives[start : start + chunk],
            max_relative_score=config.max_relative_score,
            depth=config.depth,
        )
    negatives = [None if i < 0 else str(doc_ids[i]) for i in picked]
    record = {
        "kind": MINING_KIND,
        "encoder": encoder_label(config.encoder),
        "max_relative_score": config.max_relative_score,
        "depth": config.depth,
        "queries": len(negatives),
        "without_negative": sum(n is None for n in negatives),
        "statement": "mined from the public corpus with a public pretrained encoder: "
        "post-processing, no privacy budget spent",
    }
    return negatives, record

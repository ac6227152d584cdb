"""The answer settings the DP-RAG evaluation found best, by per-answer epsilon.

`retriever serve`, `retriever answer` and the pipeline's rag stage default to
``mechanism="auto"``: the mechanism that won `scripts/dp_rag_eval.py` with the same
retrieval (dense: `docs/dp_rag_eval.json`, and `docs/dp_rag_dense_keywords.json` for
keywords; term overlap: `docs/dp_rag_overlap.json`; the DP-RAG tables of
docs/results/tables.md) at the largest evaluated per-answer epsilon not above the requested
one (the smallest evaluated one below it), with the k it was evaluated at. Individual
(per-document) accounting takes icl, the one mechanism with a zCDP curve. The choice
depends on public parameters only.
"""

from __future__ import annotations

from retriever.rag.config import ACCOUNTING_MODES, RETRIEVALS
from retriever.rag.plan import MECHANISMS

# k (documents the threshold aims at; also the voters' cap) each mechanism was evaluated at
# (answer-vote: probed on 10 questions only, not in the evaluation's table)
EVALUATED_K: dict[str, int] = {
    "icl": 32, "vote": 64, "sparse-vote": 32, "answer-vote": 64, "keywords": 64,
}  # fmt: skip
# Individual accounting's public relevance threshold tau per retrieval, calibrated on a
# public world (`scripts/payer_precision.py --seed 1`: another draw of invented diseases):
# the smallest tau of those tried at which at least 90% of the payers were relevant
# (dense all-MiniLM-L6-v2: 0.928 at 0.6; term overlap: 1.000 at 0.75; at 0.5 they were
# 0.635 and 0.579). Read on the evaluation world: 0.930 and 1.000.
CALIBRATED_RELEVANCE: dict[str, float] = {"dense": 0.6, "overlap": 0.75}

# retrieval -> per-answer epsilon -> the mechanism with the best accuracy there (ties: more
# abstentions)
EVALUATED: dict[str, dict[float, str]] = {
    # keywords with dense scores: docs/dp_rag_dense_keywords.json (epsilon 5 and 10 only)
    "dense": {1.0: "icl", 3.0: "icl", 5.0: "keywords", 10.0: "icl"},
    "overlap": {1.0: "keywords", 3.0: "keywords", 5.0: "keywords", 10.0: "keywords"},
}


def best_mechanism(epsilon: float, retrieval: str = "dense") -> str:
    """The evaluated best mechanism at per-answer `epsilon` (see the module docstring)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon=}")
    if retrieval not in RETRIEVALS:
        raise ValueError(f"retrieval must be one of {RETRIEVALS}, got {retrieval=}")
    table = EVALUATED[retrieval]
    below = [e for e in table if e <= epsilon]
    return table[max(below) if below else min(table)]


def resolve(
    mechanism: str,
    k: int | None,
    epsilon: float,
    *,
    retrieval: str = "dense",
    accounting: str = "collection",
) -> tuple[str, int]:
    """(mechanism, k): "auto" becomes `best_mechanism(epsilon, retrieval)` (icl under
    individual accounting, or with a k below the one the winner was evaluated at), a
    missing k the k that mechanism was evaluated at.

    Raises:
      ValueError: an unknown mechanism, retrieval or accounting, or a k below 1.
    """
    if accounting not in ACCOUNTING_MODES:
        raise ValueError(f"accounting must be one of {ACCOUNTING_MODES}, got {accounting=}")
    if mechanism == "auto":
        individual = accounting == "individual"
        mechanism = "icl" if individual else best_mechanism(epsilon, retrieval)
        if k is not None and k < EVALUATED_K[mechanism]:
            # the winner is known at its evaluated k only (keywords with 4 voters can
            # never clear its threshold); icl releases at any k
            mechanism = "icl"
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be auto or one of {MECHANISMS}, got {mechanism=}")
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k=}")
    return mechanism, EVALUATED_K[mechanism] if k is None else k


def relevance_threshold(given: float | None, retrieval: str = "dense") -> float:
    """`given`, or the retrieval's calibrated tau (`CALIBRATED_RELEVANCE`) when None."""
    if retrieval not in RETRIEVALS:
        raise ValueError(f"retrieval must be one of {RETRIEVALS}, got {retrieval=}")
    return CALIBRATED_RELEVANCE[retrieval] if given is None else given

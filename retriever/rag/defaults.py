"""The answer settings `retriever answer`, `retriever serve` and the main job default to.

``mechanism="auto"`` under collection accounting is ``facts`` (`retriever.rag.fact_vote`):
a question whose kind of value a public rule reads ("Which team ...", "When ...", "What is
the IP address of ...") is answered from the typed facts every document states, and any
other question by ``keywords`` at the same event. Chosen on the validation fact worlds
(people, helpdesk; seed 0: every question about a fact stated in 20 documents answered at
epsilon 3 to 10); measured on the test worlds at seed 7 (docs/results/tables.md, "Single
answers from typed facts": 0.80 at epsilon 5, 0.85 at 10, where keywords answered 0.80 and
icl 0.00 on products). On the medical world ("Which disease ..." asks a name) facts answers
0.68 at epsilon 10 and 0.67 at 5 (0.60 at 3, 0.38 at 1; none wrong), against icl's 0.18 and
0.12 and non-private RAG's 0.57 (docs/dp_rag_facts_eval.json, docs/dp_rag_eval.json; 60
questions each). Individual (per-document) accounting
takes icl, the one mechanism with a zCDP curve, as does a k below the 64 voters keywords
was measured with (with 4 voters it could never release). The choice depends on public
parameters only.
"""

from __future__ import annotations

from retriever.rag.config import ACCOUNTING_MODES, RETRIEVALS
from retriever.rag.plan import check_mechanism

# k (documents the threshold aims at; also the voters' cap) each mechanism was evaluated at
EVALUATED_K: dict[str, int] = {"icl": 32, "keywords": 64, "facts": 64}
# Individual accounting's public relevance threshold tau per retrieval, calibrated on a
# public world (`scripts/payer_precision.py --seed 1`: another draw of invented diseases):
# the smallest tau of those tried at which at least 90% of the payers were relevant
# (dense all-MiniLM-L6-v2: 0.928 at 0.6; term overlap: 1.000 at 0.75; at 0.5 they were
# 0.635 and 0.579). Read on the evaluation world: 0.930 and 1.000.
CALIBRATED_RELEVANCE: dict[str, float] = {"dense": 0.6, "overlap": 0.75}


def resolve(
    mechanism: str,
    k: int | None,
    epsilon: float,
    *,
    retrieval: str = "dense",
    accounting: str = "collection",
) -> tuple[str, int]:
    """(mechanism, k): "auto" becomes facts (icl under individual accounting, or with a k
    below the one keywords, the fallback of facts, was evaluated at), a missing k the k that
    mechanism was evaluated at. `epsilon` and `retrieval` are checked, not used (module
    docstring: where facts was measured, it answered at least as many as the rest).

    Raises:
      ValueError: an unknown or retired mechanism (`plan.RETIRED`), retrieval or
        accounting, or a k below 1.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon=}")
    if retrieval not in RETRIEVALS:
        raise ValueError(f"retrieval must be one of {RETRIEVALS}, got {retrieval=}")
    if accounting not in ACCOUNTING_MODES:
        raise ValueError(f"accounting must be one of {ACCOUNTING_MODES}, got {accounting=}")
    check_mechanism(mechanism, auto=True)
    if mechanism == "auto":
        individual = accounting == "individual"
        mechanism = "icl" if individual else "facts"
        if k is not None and k < EVALUATED_K[mechanism]:
            # keywords (the fallback of facts) is known at its evaluated k only (with 4
            # voters it can never clear its threshold); icl releases at any k
            mechanism = "icl"
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k=}")
    return mechanism, EVALUATED_K[mechanism] if k is None else k


def relevance_threshold(given: float | None, retrieval: str = "dense") -> float:
    """`given`, or the retrieval's calibrated tau (`CALIBRATED_RELEVANCE`) when None."""
    if retrieval not in RETRIEVALS:
        raise ValueError(f"retrieval must be one of {RETRIEVALS}, got {retrieval=}")
    return CALIBRATED_RELEVANCE[retrieval] if given is None else given

"""The answer settings `retriever answer`, `retriever serve` and the main job default to.

``mechanism="auto"`` under collection accounting is ``facts`` (`retriever.rag.fact_vote`; a
question no kind rule reads is answered by ``keywords`` at the same event), chosen on the
validation fact worlds and measured on the test and medical worlds (docs/results/tables.md,
"Single answers from typed facts"; docs/guides/dp_rag.md, "In one minute": 0.68 at epsilon
10 where icl answers 0.18). Individual (per-document) accounting takes icl, the one
mechanism with a zCDP curve, as does a k below the 64 voters keywords was measured with
(with 4 voters it could never release). The choice depends on public parameters only.
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
    below the one keywords, facts' fallback, was evaluated at), a missing k the evaluated
    one (module docstring). `epsilon` and `retrieval` are checked, not used.

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

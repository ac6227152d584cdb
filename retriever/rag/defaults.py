"""The answer settings the DP-RAG evaluation found best, by per-answer epsilon.

`retriever serve`, `retriever answer` and the pipeline's rag stage default to
``mechanism="auto"``: the mechanism that won `scripts/dp_rag_eval.py`
(`docs/dp_rag_eval.json`, the DP-RAG table of docs/results/tables.md) at the largest
evaluated per-answer epsilon not above the requested one (the smallest evaluated one below
it), with the k it was evaluated at. The choice depends on public parameters only.
"""

from __future__ import annotations

from retriever.rag.plan import MECHANISMS

# k (documents the threshold aims at; also the voters' cap) each mechanism was evaluated at
# (answer-vote: probed on 10 questions only, not in the evaluation's table)
EVALUATED_K: dict[str, int] = {
    "icl": 32, "vote": 64, "sparse-vote": 32, "answer-vote": 64, "keywords": 64,
}  # fmt: skip
# per-answer epsilon -> the mechanism with the best accuracy there (ties: more abstentions)
EVALUATED: dict[float, str] = {1.0: "icl", 3.0: "icl", 5.0: "icl", 10.0: "icl"}


def best_mechanism(epsilon: float) -> str:
    """The evaluated best mechanism at per-answer `epsilon` (see the module docstring)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon=}")
    below = [e for e in EVALUATED if e <= epsilon]
    return EVALUATED[max(below) if below else min(EVALUATED)]


def resolve(mechanism: str, k: int | None, epsilon: float) -> tuple[str, int]:
    """(mechanism, k): "auto" becomes `best_mechanism(epsilon)`, a missing k the k that
    mechanism was evaluated at.

    Raises:
      ValueError: an unknown mechanism or a k below 1.
    """
    if mechanism == "auto":
        mechanism = best_mechanism(epsilon)
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be auto or one of {MECHANISMS}, got {mechanism=}")
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k=}")
    return mechanism, EVALUATED_K[mechanism] if k is None else k

"""The answer settings the DP-RAG evaluation found best, by per-answer epsilon.

`retriever serve`, `retriever answer` and the pipeline's rag stage default to
``mechanism="auto"``: the mechanism and number of documents that won
`scripts/dp_rag_eval.py` (`docs/dp_rag_eval.json`, the README's DP-RAG table) at the
largest evaluated per-answer epsilon not above the requested one (the smallest evaluated
one below it). The choice depends on public parameters only.
"""

from __future__ import annotations

import dataclasses

MECHANISMS = ("icl", "vote", "sparse-vote")


@dataclasses.dataclass(frozen=True)
class AnswerDefaults:
    """A mechanism and its k (documents the threshold aims at; voters for vote)."""

    mechanism: str
    k: int


# per-answer epsilon -> the evaluation's best cell (accuracy, then fewer unreadable answers)
EVALUATED: dict[float, AnswerDefaults] = {
    1.0: AnswerDefaults("icl", 32),
    3.0: AnswerDefaults("icl", 32),
    5.0: AnswerDefaults("icl", 32),
    10.0: AnswerDefaults("icl", 32),
}


def answer_defaults(epsilon: float) -> AnswerDefaults:
    """The evaluated best settings at per-answer `epsilon` (see the module docstring)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon=}")
    below = [e for e in EVALUATED if e <= epsilon]
    return EVALUATED[max(below) if below else min(EVALUATED)]


def resolve_mechanism(mechanism: str, epsilon: float) -> str:
    """`mechanism`, or the evaluated best one at `epsilon` for "auto"."""
    if mechanism == "auto":
        return answer_defaults(epsilon).mechanism
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be auto or one of {MECHANISMS}, got {mechanism=}")
    return mechanism

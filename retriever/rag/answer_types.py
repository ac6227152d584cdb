"""What a DP-RAG answer returns: the released `Answer`, its cost per stage (`StageCharge`),
the abstention text, and the error of an answer that failed after its budget check.

Every field is public: a released value or a public cost (`retriever.rag.answer` states the
mechanisms). Its own module so that `retriever.rag.answer` and `retriever.rag.reuse` need
not import each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from synthgen.privacy import format_epsilon, format_left

ABSTENTION_TEXT = "No answer: the private documents did not settle one at this privacy level."
T = TypeVar("T")


class AnswerFailedError(RuntimeError):
    """An answer failed after its budget check: charged its worst case, nothing released.

    Its message is fixed: the failure's own text may quote private data and never reaches
    the caller.
    """


def after_charge(release: Callable[[], T]) -> T:
    """`release()`; a failure after the charge raises a context-free `AnswerFailedError`."""
    try:
        return release()
    except Exception:  # noqa: BLE001 - re-raised below without its private text
        pass
    raise AnswerFailedError(
        "the answer failed after its budget check; it was charged its worst case "
        "and released nothing"
    )


@dataclasses.dataclass(frozen=True)
class StageCharge:
    """What one stage of an answer cost (public)."""

    stage: str
    epsilon: float
    delta: float


@dataclasses.dataclass(frozen=True)
class Answer:
    """A released answer and what it cost.

    Attributes:
      text: the answer (`ABSTENTION_TEXT` when it abstains).
      mechanism: "icl", "keywords" or "facts".
      tokens: answer tokens released.
      paid_tokens: releases that cost budget, all planned (`AnswerPlan.max_releases`).
      charges: per stage (retrieval, tokens, score).
      epsilon, delta: the answer's, under PLD composition of its charges.
      remaining_epsilon: the tenant's remaining budget after the answer (None: no ledger).
      selected_count, confidence: the number of selected documents and their mean
        similarity, from the Laplace-noised count and sum (None: no score stage).
      ref: the public random id of the answer's charges in the ledger (None: no ledger).
      abstained: the private documents did not move the answer (icl: the released tokens
        are the public LM's greedy text; keywords and facts: nothing, or no leading value,
        was released): post-processing; the answer is charged all the same.
      truncated: the answer's deadline passed before its last token (charged the same).
      reused: handed out again (`retriever.rag.reuse`): the text, epsilon (and, for the
        tenant it was released to, the ref) are the first release's; nothing was charged
        (``charges`` is empty: sum charges, not epsilon, to total what answers cost).
    """

    text: str
    mechanism: str
    tokens: int
    paid_tokens: int
    charges: tuple[StageCharge, ...]
    epsilon: float
    delta: float
    remaining_epsilon: float | None
    selected_count: float | None = None
    confidence: float | None = None
    ref: str | None = None
    abstained: bool = False
    truncated: bool = False
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        """The fields, and each spend as people read it (`synthgen.privacy.figures`: the
        total and every stage rounded up, the remainder rounded down, 4 decimals): the
        same strings as the CLI, the service's log and its page."""
        out = dataclasses.asdict(self)
        out["epsilon_text"] = format_epsilon(self.epsilon)
        out["remaining_epsilon_text"] = format_left(self.remaining_epsilon)
        for charge in out["charges"]:
            charge["epsilon_text"] = format_epsilon(charge["epsilon"])
        return out

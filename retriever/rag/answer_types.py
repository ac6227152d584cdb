"""What a DP-RAG answer returns: the released `Answer`, its cost per stage (`StageCharge`),
the abstention text, and the error of an answer that failed after its budget check.

Its own module so that the answer loop (`retriever.rag.answer`) and what keeps released
answers (`retriever.rag.reuse`) both import it without importing each other. Every field is
public: a released value or a public cost (`retriever.rag.answer` states the mechanisms).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from synthgen.privacy import format_epsilon, format_left

ABSTENTION_TEXT = "No answer: the private documents did not settle one at this privacy level."


class AnswerFailedError(RuntimeError):
    """An answer failed after its budget check: charged its worst case, nothing released.

    Its message is fixed: the failure's own text may quote private data and never reaches
    the caller.
    """


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
      paid_tokens: releases that cost budget, all planned (icl: max_tokens; keywords and
        facts: 1).
      charges: per stage (retrieval, tokens, score).
      epsilon: the answer's (epsilon, delta) under PLD composition of its charges.
      delta: see epsilon.
      remaining_epsilon: the tenant's remaining budget after the answer (None: no ledger).
      selected_count: number of selected documents, Laplace-noised (None: no score stage).
      confidence: mean similarity of the selected documents, from the noised sum and count
        (None: no score stage).
      ref: the public random id of the answer's charges in the ledger (None: no ledger).
      abstained: the private documents did not move the answer (icl: the released tokens
        are the public LM's own greedy text; keywords and facts: nothing was released, or
        no value led). Decided from released values and the public prompt only
        (post-processing); the answer is charged all the same.
      truncated: the answer's deadline passed before its last token (fewer tokens; the
        charge is the same).
      reused: handed out again from `answers` (`retriever.rag.reuse`): the text and
        epsilon are the first release's (the ref too, for the tenant it was released
        to); nothing was charged (``charges`` is empty: sum charges, not epsilon, to
        total what answers cost).
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

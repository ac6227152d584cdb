"""Released answers, reused: a question asked again gets the answer already released.

A DP-RAG answer is a DP release. Handing the same text out again is post-processing and
costs no privacy (Dwork & Roth 2014, Proposition 2.1): no document pays, no quota or
collection cap is charged, and no LM runs. Under a stream of questions with repetition
(the same question asked by many users, or again by the same one) this keeps the records
that a popular question draws on from spending their budget on answers already given.

What is a repeat is decided from public values only: the question's text, normalised
(`question_key`: case, spacing and final punctuation), and the answer's event (mechanism,
epsilon, delta). Paraphrases are not matched. An abstention or a truncated answer is not
kept, so asking again may still get an answer (and pays again).

Scopes:
  * ``tenant``: a tenant gets back only answers released to itself;
  * ``shared``: any tenant gets any released answer. The documents' guarantee is the same
    (it already covers every answer given to any tenant), but an immediate answer tells a
    tenant that someone asked the same question before: tenants learn of each other's
    questions.

The answers are kept in memory, for the life of the `DPRag` (and its `with_config` copies).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

REUSE_SCOPES = ("tenant", "shared")
_SPACES = re.compile(r"\s+")


def question_key(question: str) -> str:
    """The question's text with case, runs of spaces and final punctuation normalised."""
    return _SPACES.sub(" ", question.casefold()).strip().rstrip("?!. ").strip()


class ReleasedAnswers:
    """The answers a `DPRag` released, by (tenant or everyone, question, event)."""

    def __init__(self, scope: str = "tenant") -> None:
        if scope not in REUSE_SCOPES:
            raise ValueError(f"scope must be one of {', '.join(REUSE_SCOPES)}, got {scope!r}")
        self.scope = scope
        self._answers: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _key(self, tenant: str, question: str, plan) -> tuple:
        owner = tenant if self.scope == "tenant" else None
        return (owner, question_key(question), plan.mechanism, plan.epsilon, plan.delta)

    def get(self, tenant: str, question: str, plan):
        """The answer released before for this question and event, or None."""
        with self._lock:
            return self._answers.get(self._key(tenant, question, plan))

    def put(self, tenant: str, question: str, plan, answer) -> None:
        """Keeps `answer` unless it abstained or was truncated (asking again may do better)."""
        if answer.abstained or answer.truncated:
            return
        with self._lock:
            self._answers.setdefault(self._key(tenant, question, plan), answer)

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)


def reused(answer, remaining_epsilon: float | None):
    """`answer` handed out again: nothing charged, the tenant's remaining budget now."""
    return dataclasses.replace(answer, charges=(), reused=True, remaining_epsilon=remaining_epsilon)

"""Released answers, reused: a question asked again gets the answer already released.

A DP-RAG answer is a DP release. Handing the same text out again is post-processing and
costs no privacy (Dwork & Roth 2014, Proposition 2.1): no document pays, no quota or
collection cap is charged, and no LM runs. Under a stream of questions with repetition
(the same question asked by many users, or again by the same one) this keeps the records
that a popular question draws on from spending their budget on answers already given.

What is a repeat is decided from public values only: the question's text, normalised
(`question_key`: case, spacing and final punctuation), and everything that fixes the
answer's event and meaning: the collection's name, the `RagConfig`, the prompt format and
the answer's plan (mechanism, epsilon, delta, tokens, shares). Paraphrases are not
matched. An abstention or a truncated answer is not kept, so asking again may still get an
answer (and pays again). A repeat is handed out without a budget check: a tenant whose
budget is spent still gets back what it was given before.

Scopes:
  * ``tenant``: a tenant gets back only answers released to itself. Every tenant's cap
    keeps bounding what that tenant learns.
  * ``shared`` (individual accounting only): any tenant gets any released answer (without
    the first tenant's ledger ref). The per-document guarantee covers every answer given
    to any tenant, so it is unchanged; tenant scopes there are quotas. Under collection
    accounting a tenant's cap is a privacy bound for that tenant, which a shared answer
    would bypass, so ``shared`` is refused there. An immediate answer tells a tenant that
    someone asked the same question before: tenants learn of each other's questions.

The answers are kept in memory, without a size limit, for the life of the
`ReleasedAnswers` object (shared by the `DPRag.with_config` copies made after it was set).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Hashable

from retriever.rag.answer_types import Answer

REUSE_SCOPES = ("tenant", "shared")
_SPACES = re.compile(r"\s+")


def question_key(question: str) -> str:
    """The question's text with case, runs of spaces and final punctuation normalised
    (questions differing only in case, e.g. of an id, are one question)."""
    return _SPACES.sub(" ", question.casefold()).strip().rstrip("?!. ").strip()


class ReleasedAnswers:
    """The answers a `DPRag` released, by (tenant or everyone, question, event).

    Privacy: holds released answers only (`put` is called with what `DPRag.answer`
    returned); handing one out again is post-processing.
    """

    def __init__(self, scope: str = "tenant") -> None:
        if scope not in REUSE_SCOPES:
            raise ValueError(f"scope must be one of {', '.join(REUSE_SCOPES)}, got {scope!r}")
        self.scope = scope
        self._answers: dict[tuple, tuple[str, Answer]] = {}
        self._lock = threading.Lock()

    def _key(self, tenant: str, question: str, event: Hashable) -> tuple:
        owner = tenant if self.scope == "tenant" else None
        return (owner, question_key(question), event)

    def get(self, tenant: str, question: str, event: Hashable) -> Answer | None:
        """The answer released before for this question and `event` (the public values
        that fix the answer: `DPRag` passes its dataset, config, prompt and plan), marked
        `reused`, with nothing charged; None when there is none."""
        with self._lock:
            found = self._answers.get(self._key(tenant, question, event))
        if found is None:
            return None
        owner, answer = found
        ref = answer.ref if owner == tenant else None  # another tenant's charges: not its
        return dataclasses.replace(answer, charges=(), reused=True, ref=ref)

    def put(self, tenant: str, question: str, event: Hashable, answer: Answer) -> None:
        """Keeps a released `answer` unless it abstained or was truncated."""
        if answer.abstained or answer.truncated:
            return
        with self._lock:
            self._answers.setdefault(self._key(tenant, question, event), (tenant, answer))

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)

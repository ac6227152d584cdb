"""Released answers, reused: a question asked again gets the answer already released.

A DP-RAG answer is a DP release; handing the same text out again is post-processing and
costs no privacy (Dwork & Roth 2014, Proposition 2.1): no document pays, no quota or cap is
charged, no LM runs, and no budget is checked. A repeat is decided from public values only:
the question's text up to case, spacing and final punctuation (`question_key`; paraphrases
are not matched), and the collection's name, `RagConfig`, prompt format and plan. An
abstention or a truncated answer is not kept. Scope ``tenant``: a tenant gets back only its
own answers, so each tenant's cap keeps bounding what it learns. Scope ``shared``
(individual accounting only, where the per-document guarantee covers every answer to any
tenant and tenant scopes are quotas): any tenant gets any answer, without the first
tenant's ledger ref, and learns that someone asked it before. Kept in memory, without a
size limit, for the life of the `ReleasedAnswers` object (shared by the `DPRag.with_config`
copies made after it was set). See docs/guides/dp_rag.md ("Reusing released answers").
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
        """The answer released before for this question and `event` (`DPRag`'s dataset,
        config, prompt and plan), marked `reused`, nothing charged; None when there is none."""
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

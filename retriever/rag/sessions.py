"""The decode side of an answer at its public shape: prompt rows, LM sessions, the deadline.

`retriever.rag.answer.DPRag` builds one `PromptRows` per answer (always `RagConfig.voters`
private prompts, padded to one public length), runs them in one batched `Sessions` next to
the public prompt's own session, and stops the loops at a `Deadline`. Nothing here reads
private data beyond the rows it is given; shapes and loop counts are public (Privacy rule 9).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np


def tokenize_documents(lm, texts: Sequence[str]) -> list[list[int]]:
    """Every document's token ids, once, before any answer: an answer then only slices
    them (the same work for any selection), and a text the tokenizer refuses is refused
    here, with its position, instead of failing an answer that selected it."""
    tokens = []
    for position, text in enumerate(texts):
        try:
            tokens.append([int(t) for t in lm.encode(text)])
        except Exception:  # noqa: BLE001 - the message may quote the text
            raise ValueError(f"document at position {position} cannot be tokenized") from None
    return tokens


def usable_rows(logprobs: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows that are not distributions (NaN, +inf, all -inf) count as padding: zero
    weight and zero values, so a numerical fault on one document's prompt changes that
    row's contribution only (within the sensitivity) and never fails the answer."""
    rows = np.asarray(logprobs, dtype=np.float64)
    bad = np.any(np.isnan(rows) | (rows == np.inf), axis=1) | np.all(rows == -np.inf, axis=1)
    if not bad.any():
        return rows, weights
    return np.where(bad[:, None], 0.0, rows), np.where(bad, 0.0, weights)


@dataclasses.dataclass(frozen=True)
class PromptRows:
    """The private prompts of one answer at its public shape (`DPRag._rows`).

    Attributes:
      prompts: `config.voters` prompts: documents first, then padding rows.
      weights: 1 for a document's row, 0 for a padding row (private: used in sums only).
      public: the public prompt (the question, no document).
      length: the public length every private prompt is padded to.
      documents: with the collection's precomputed keys (`DPRag(document_cache=True)`):
        (kv, the row's document in kv, the suffix after it); the LM then runs only the
        suffix (`FlaxLM.start_documents`) and `prompts` are not run.
    """

    prompts: list[list[int]]
    weights: np.ndarray
    public: list[int]
    length: int
    documents: tuple | None = None

    def start(self, lm, max_tokens: int) -> np.ndarray:
        """The private rows' next-token log-probabilities: a session of `lm` on them."""
        if self.documents is not None:
            kv, rows, suffix = self.documents
            return lm.start_documents(kv, rows, suffix, max_tokens)
        return lm.start(self.prompts, max_tokens, length=self.length)


class Deadline:
    """A wall-time bound on the decode loops (None: none); `passed` once it struck."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline, self.passed = deadline, False

    def check(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.passed = True
        return self.passed


class Sessions:
    """The private rows' batched session (always the public shape) and the public
    prompt's own session."""

    def __init__(self, lm, public_lm, rows: PromptRows, max_tokens: int) -> None:
        self.lm, self.public_lm = lm, public_lm
        self.private = rows.start(lm, max_tokens)
        self.public = public_lm.start([rows.public], max_tokens)

    def append(self, token: int, *, last: bool) -> None:
        if last:  # no next token will be drawn: skip the step
            return
        self.private = self.lm.append(token)
        self.public = self.public_lm.append(token)

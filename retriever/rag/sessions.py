"""The decode side of an answer at its public shape: prompt rows, LM sessions, the deadline.

`retriever.rag.answer.DPRag` builds one `PromptRows` per answer (always `RagConfig.voters`
private prompts, padded to one public length), runs them in one batched session next to
the public prompt's own session, and stops the loops at a `Deadline`. Nothing here reads
private data beyond the rows it is given; shapes and loop counts are public (Privacy rule 9).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np


def tokenize_documents(lm, texts: Sequence[str]) -> list[list[int]]:
    """Every document's token ids, once, before any answer (which then only slices them);
    a text the tokenizer refuses is refused here, by position, not in an answer."""
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
      documents: with precomputed keys (`DPRag(document_cache=True)`): (kv, each row's
        document in kv, the suffix), which the LM runs instead of `prompts`.
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


PADDING_TEXT = " ."  # the public filler document of a padding row


def filler_tokens(lm, width: int) -> list[int]:
    """The public filler document, `width` tokens."""
    return (lm.encode(PADDING_TEXT) * width)[:width]


def document_keys(lm, prompt, tokens: Sequence[Sequence[int]], config, given):
    """Every document's keys and values after the prompt's head, and the filler's (last),
    computed before any answer (`synthgen.models.document_kv`), or `given` when it is such
    keys of this collection (`DPRag(document_cache=...)`)."""
    if not hasattr(lm, "document_kv"):
        raise ValueError(f"document_cache needs an LM with document_kv: {type(lm)}")
    width = config.max_document_tokens
    head, _ = prompt.document_parts(lm, "")
    documents = [list(t[:width]) for t in tokens] + [filler_tokens(lm, width)]  # filler: last
    if given is True:
        return lm.document_kv(head, documents, width, progress=True)
    from synthgen.models.document_kv import documents_digest

    if (
        getattr(given, "width", None) != width
        or given.digest != documents_digest(head, documents, width)
        or given.params is not getattr(lm, "params", None)
    ):
        raise ValueError(
            "document_cache: keys of other documents, width, prompt or model; pass "
            "True to compute them"
        )
    return given


def build_rows(
    lm,
    prompt,
    question: str,
    tokens: Sequence[Sequence[int]],
    indices: np.ndarray,
    weights: np.ndarray,
    config,
    kv=None,
) -> PromptRows:
    """An answer's private prompts at the public shape: `config.voters` rows, the selected
    documents' (weight 1) and padding rows (weight 0: the public filler document), from
    token ids and prompt parts encoded once, so building them costs the same whichever rows
    are real. Grouped voters (`indices` [voters, documents_per_voter], -1 for an empty
    place): a row reads its group's documents, padded to the length of a full group. `kv`:
    the collection's precomputed keys (`document_keys`) for one-document rows."""
    width = config.max_document_tokens
    prefix, suffix = prompt.document_parts(lm, question)
    filler = filler_tokens(lm, width)
    public = prompt.encode(lm, question, [])
    between = lm.encode("\n") + lm.encode("- ")  # as `PromptFormat.encode` joins them
    groups = indices.reshape(len(indices), -1)  # one document per row, or a group
    prompts = []
    for group, w in zip(groups, weights, strict=True):
        docs = [list(tokens[i][:width]) for i in group if i >= 0] if w else [filler]
        row = list(prefix)
        for j, doc in enumerate(docs):
            row += (between if j else []) + doc
        prompts.append(row + suffix)
    g = groups.shape[1]
    length = len(prefix) + g * len(filler) + (g - 1) * len(between) + len(suffix)
    cached = None
    if indices.ndim == 1 and kv is not None and kv.width == width and list(kv.head) == prefix:
        # the same work for any rows: a gather of config.voters rows of width W
        filler_row = kv.documents - 1  # `document_keys` puts the filler last
        rows = [int(i) if w else filler_row for i, w in zip(indices, weights, strict=True)]
        cached = (kv, rows, suffix)
    return PromptRows(prompts, weights, public, length=length, documents=cached)

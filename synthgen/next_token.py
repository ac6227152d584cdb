"""Next-token log-probabilities of a frozen LM for a batch of prompts: the `NextTokenLM`
protocol and its shared helpers.

DP few-shot generation (`synthgen.fewshot`) feeds the same released tokens to M prompts, so
a backend keeps a *session*: `start(prompts)` and `append(token)` return log-probs [B, V]
at one cached step per row. `score(prompts)`, the stateless full forward, must leave an
open session untouched (the public prompt is scored alone while the private session is
open). The backends (`synthgen.lm_backends`, `synthgen.openai_backend`) import this module
and never each other.

Privacy: rows of one batch share batched numerics, so a row's log-probabilities may depend
(by float rounding) on the other rows of its call. Callers keep public and private prompts
in separate calls (`synthgen.fewshot.generate` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class NextTokenLM(Protocol):
    """A frozen LM seen through its next-token distributions."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Token ids of `text` (BOS first when `bos` and the model uses one)."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def start(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, length: int | None = None
    ) -> np.ndarray:
        """Opens a session; log-probs [B, V] of the token after each prompt.

        `length` (public) pads every prompt to at least this many tokens, so the session's
        shape, compiled program and time do not depend on how long the prompts are (a
        backend without shapes may ignore it).
        """
        ...

    def append(self, token: int | Sequence[int]) -> np.ndarray:
        """Feeds `token` to every row of the session (or one token per row, in row order);
        log-probs [B, V] of the next token."""
        ...

    def score(self, prompts: Sequence[Sequence[int]], *, length: int | None = None) -> np.ndarray:
        """Stateless: log-probs [B, V] of the token after each prompt (full forward).

        Leaves an open `start`/`append` session untouched. `length` (public) pads as
        `start`'s does.
        """
        ...


def row_tokens(token: int | Sequence[int], rows: int) -> list[int]:
    """`append`'s argument as one token per row: an int for every row, or one per row."""
    if isinstance(token, int | np.integer):
        return [int(token)] * rows
    tokens = [int(t) for t in token]
    if len(tokens) != rows:
        raise ValueError(f"need one token per row: {len(tokens)=}, {rows=}")
    return tokens


class RescoredSession:
    """`start` and `append` of a backend without a cache: every step scores its rows again
    with the backend's own `score` (the rows are kept in ``_rows``)."""

    def start(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, length: int | None = None
    ) -> np.ndarray:
        self._rows, self._length = [list(p) for p in prompts], length
        return self.score(self._rows, length=length)

    def append(self, token: int | Sequence[int]) -> np.ndarray:
        for row, t in zip(self._rows, row_tokens(token, len(self._rows)), strict=True):
            row.append(t)
        if self._length is not None:  # the session's padding grows with its tokens
            self._length += 1
        return self.score(self._rows, length=self._length)

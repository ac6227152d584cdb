"""Prompts of DP few-shot generation: templates, targets and prompt token ids.

Privacy:
  Targets are public (a public label list or public documents). The public prompt (header
  + stem, no shots) reads no private row, and `_Prompts` cuts every field to a public
  number of tokens, so `_Prompts.shot_bound` depends only on the template.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping, Sequence
from typing import Any

from synthgen.next_token import NextTokenLM


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """How prompts are written: header + shots + stem, then the generated tokens.

    `header` and `stem` are formatted with the synthetic example's target fields (its
    label, or the public document a query is generated for); `shot` with a private row.
    The public prompt is header + stem with no shots.
    """

    header: str
    shot: str
    stem: str

    def fields(self) -> tuple[set[str], set[str]]:
        """(fields of a private row, fields of a target) the template reads."""

        def names(text: str) -> set[str]:
            return {f for _, f, _, _ in string.Formatter().parse(text) if f}

        return names(self.shot), names(self.header) | names(self.stem)


DOCUMENT_TEMPLATE = PromptTemplate(
    header="Here are paragraphs from encyclopedia articles about {label}.\n\n",
    shot="Paragraph: {text}\n\n",
    stem="Paragraph:",
)
QUERY_TEMPLATE = PromptTemplate(
    header="Here are documents and search queries that find them.\n\n",
    shot="Document: {document}\nQuery: {query}\n\n",
    stem="Document: {document}\nQuery:",
)


class _Prompts:
    """Token ids of prompt pieces, encoded once; every field's ids cut to `field_tokens`.

    A piece is its template's literal text and its fields, each encoded separately, so a
    shot has at most `shot_bound()` tokens whatever the private text (a public bound).
    """

    def __init__(self, lm: NextTokenLM, template: PromptTemplate, rows, field_tokens: int):
        self.lm, self.template, self.rows, self.field_tokens = lm, template, rows, field_tokens
        self._shots: dict[int, list[int]] = {}

    def _render(self, text: str, row: Mapping[str, Any], *, bos: bool = False) -> list[int]:
        ids = self.lm.encode("", bos=True) if bos else []
        for literal, field, _, _ in string.Formatter().parse(text):
            ids += self.lm.encode(literal) if literal else []
            if field:
                ids += self.lm.encode(str(row[field]))[: self.field_tokens]
        return ids

    def _bound(self, text: str) -> int:
        parsed = list(string.Formatter().parse(text))
        literals = sum(len(self.lm.encode(lit)) for lit, _, _, _ in parsed if lit)
        return literals + self.field_tokens * sum(1 for _, f, _, _ in parsed if f)

    def shot_bound(self) -> int:
        """Most tokens a shot can have (public: template and `field_tokens` only)."""
        return self._bound(self.template.shot)

    def worst_length(self, frames: Sequence[tuple[list[int], list[int]]], shots: int) -> int:
        """Most tokens a prompt of `shots` shots on any of `frames` can have (public)."""
        return max(len(h) + len(st) for h, st in frames) + shots * self.shot_bound()

    def shot(self, index: int) -> list[int]:
        if index not in self._shots:
            self._shots[index] = self._render(self.template.shot, self.rows[index])
        return self._shots[index]

    def frame(self, target: Mapping[str, Any]) -> tuple[list[int], list[int]]:
        """(header ids, stem ids) of a target."""
        header = self._render(self.template.header, target, bos=True)
        return header, self._render(self.template.stem, target)

    def prompt(self, frame: tuple[list[int], list[int]], shots: Sequence[int]) -> list[int]:
        header, stem = frame
        return header + [t for i in shots for t in self.shot(i)] + stem


def round_robin_targets(labels: Sequence[Any], num_examples: int) -> list[dict]:
    """`num_examples` targets cycling over the sorted distinct labels (a public schedule).

    `labels` must be a public list (never read from the private rows).
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples=}")
    distinct = sorted(set(labels), key=str)
    if not distinct:
        raise ValueError("no labels")
    return [{"label": distinct[i % len(distinct)]} for i in range(num_examples)]

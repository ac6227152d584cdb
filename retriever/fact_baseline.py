"""The non-private baseline on your own collection: what a fact release could answer at best.

Operator-only, local and **not DP**, like `synthgen.knowledge.preview`. For your questions
(with the answers you expect, where known) it reports two ceilings: whether the BM25 top-k
records hold the expected answer (retrieval without privacy), and the typed reader on exact
counts (the typed release's own extraction, `synthgen.knowledge.typed_facts`, with exact
record counts, no noise, no threshold, answered by the release's reader with no gap,
`retriever.typed_answers`): what it cannot answer, no release can. Compare a release's
answers (`retriever knowledge answer`) to see what privacy and the extraction cost.

Privacy:
  Exact counts and texts of the private records: printed to the operator's terminal,
  never written into a release and never charged. Settings chosen by looking at it are
  chosen on private data, outside any release's guarantee (as for the preview).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence

from retriever.lexical import BM25
from retriever.typed_answers import TypedFactAnswerer
from synthgen.knowledge.facts import fact_records
from synthgen.knowledge.typed_facts import record_fact_keys


def states(text: str, expected: str) -> bool:
    """Whether `text` states `expected` whole (case-folded, spaces and dashes normalised,
    at word boundaries: a text saying "45" does not state "45 days")."""

    def norm(t: str) -> str:
        t = t.lower().replace("\u2013", "-").replace("\u2014", "-")
        return re.sub(r"\s+", " ", t).strip()

    if not expected.strip():
        return False
    pattern = r"(?<![\w.:])" + re.escape(norm(expected)) + r"(?![\w:]|\.\w)"
    return re.search(pattern, norm(text)) is not None


@dataclasses.dataclass(frozen=True)
class BaselineRow:
    """One question: the exact-count answer (None: abstained) and, with an expected answer,
    whether it is right and whether the top-k records hold it."""

    question: str
    expected: str | None
    typed_answer: str | None
    typed_right: bool | None
    retrieval_hit: bool | None


@dataclasses.dataclass(frozen=True)
class Baseline:
    """Per-question rows and their summary (not DP)."""

    rows: list[BaselineRow]
    k: int
    max_pairs: int

    def summary(self) -> dict:
        known = [r for r in self.rows if r.expected]
        share = (lambda xs: sum(xs) / len(xs)) if known else (lambda xs: None)
        return {
            "not_dp": "exact counts of your private records: for your eyes only",
            "questions": len(self.rows),
            "with_expected_answers": len(known),
            "typed_answered": sum(r.typed_answer is not None for r in self.rows),
            "typed_right": share([bool(r.typed_right) for r in known]),
            f"retrieval_top{self.k}_holds_answer": share([bool(r.retrieval_hit) for r in known]),
            "max_pairs": self.max_pairs,
        }


def fact_baseline(
    texts: Sequence[str],
    questions: Sequence[str],
    expected: Sequence[str | None] | None = None,
    *,
    max_pairs: int = 1,
    k: int = 4,
) -> Baseline:
    """The two ceilings of the module docstring for `questions` over the records `texts`.

    Args:
      texts: the private records.
      questions: the questions.
      expected: each question's expected answer, or None where unknown.
      max_pairs: K, facts per record (the release's `--max-pairs`).
      k: records the retrieval ceiling reads.

    Raises:
      ValueError: no records or questions, expected of another length, or k, K below 1.
    """
    if not texts or not questions:
        raise ValueError("need records and questions")
    if expected is not None and len(expected) != len(questions):
        raise ValueError(f"{len(expected)} expected answers for {len(questions)} questions")
    if k < 1 or max_pairs < 1:
        raise ValueError(f"k and max_pairs must be >= 1, got {k=}, {max_pairs=}")
    counts = Counter(key for text in texts for key in record_fact_keys(text, max_pairs))
    records = fact_records({key: float(n) for key, n in counts.items()}, 1_000, "typed")
    reader = TypedFactAnswerer(records, noise_stddev=1.0, gap=0.0)
    _, top = BM25(texts).search(list(questions), k)
    rows = []
    for i, question in enumerate(questions):
        answer = reader.answer(question)
        value = None if answer.abstained else answer.answer
        want = None if expected is None else expected[i]
        rows.append(
            BaselineRow(
                question=question,
                expected=want,
                typed_answer=value,
                typed_right=None if not want else value is not None and states(value, want),
                retrieval_hit=None if not want else any(states(texts[j], want) for j in top[i]),
            )
        )
    return Baseline(rows, k, max_pairs)

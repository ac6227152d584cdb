"""Answer a question from a typed fact release: its subject, the kind it asks for, the counts.

A typed fact release (`synthgen.knowledge.facts`, ``extractor="typed"``) holds, per released
subject, its values with their kinds and noisy counts. A question is answered in three
public steps, no LM: (1) the released subjects it names (and the subject of a released name
it names; none: abstain); (2) the kind it asks for, by a public rule on its words
(`QUESTION_KINDS`; a question no rule reads is not answered); (3) the subject's value of
that kind with the highest noisy count, summed over the m subjects named, when it leads the
second by at least `GAP` noise standard deviations (the release's own, sqrt(m) of them for
a sum); otherwise, or when no value has the kind asked, it abstains rather than name a
value of another relation. Two relations whose values share a kind are told apart only by
their counts, and a relation the collection never states is answered when the subject has
a value of the kind asked. See docs/guides/knowledge.md (The fact release).

Privacy:
  Reads only the release (DP outputs) and the public question; post-processing, charges
  nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from retriever.fact_answers import ABSTAIN, FactAnswer
from retriever.rag.question_kinds import (
    GAP,
    NAME_KINDS,
    decide,
    question_kinds,
    relation_noun,
    whole_words,
)
from synthgen.knowledge.typed_facts import value_kind


class TypedFactAnswerer:
    """Answers questions from a typed fact release's records (`fact_records`, typed)."""

    def __init__(self, records: Sequence[dict], noise_stddev: float, gap: float = GAP) -> None:
        if not noise_stddev > 0 or gap < 0:
            raise ValueError(f"need noise_stddev > 0 and gap >= 0: {noise_stddev=}, {gap=}")
        self.records = {r["topic"]: r for r in records}
        self.margin = gap * noise_stddev

    def subjects(self, question: str) -> list[str]:
        """The released subjects `question` names (case-folded), longest first; not one it
        uses as a relation ("keeper" in "Who is the keeper of the autoclave?")."""
        low = question.lower()
        found: list[str] = []
        for subject in sorted(self.records, key=len, reverse=True):
            key = subject.lower()
            inside = any(re.search(whole_words(key), f.lower()) for f in found)
            if re.search(whole_words(key), low) and not inside:
                found.append(subject)
        return [s for s in found if not relation_noun(question, s)]

    def answer(self, question: str) -> FactAnswer:
        named = self.subjects(question)
        kinds = question_kinds(question)
        candidates: dict[str, float] = {}
        summed = 0  # named subjects whose counts add up (their sum's noise: sqrt(m) sigma)
        for subject in named:  # a value several named subjects share: their counts add up
            asked = [f for f in self.records[subject]["facts"] if f["kind"] in kinds]
            summed += bool(asked)
            for fact in asked:
                value = fact["value"]
                candidates[value] = candidates.get(value, 0.0) + float(fact["count"])
        # a name the question names may be a released value: its subject is a candidate
        # too ("Velmora Dynamics employs Dara Quill" answers "Which company employs Dara Quill?")
        low = question.lower()
        for subject, record in self.records.items():
            if subject in named or value_kind(subject) not in kinds:
                continue
            for fact in record["facts"]:
                name = fact["value"].lower()
                if fact["kind"] in NAME_KINDS and re.search(whole_words(name), low):
                    count = float(fact["count"])
                    candidates[subject] = max(candidates.get(subject, 0.0), count)
                    if subject not in named:
                        named.append(subject)
        chosen = decide(candidates, self.margin * math.sqrt(max(summed, 1)))
        if chosen is None:
            return FactAnswer(ABSTAIN, named, True, candidates)
        return FactAnswer(chosen, named, False, candidates)

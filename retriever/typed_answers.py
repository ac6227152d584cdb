"""Answer a question from a typed fact release: its subject, the kind it asks for, the counts.

A typed fact release (`synthgen.knowledge.facts`, ``extractor="typed"``) holds, per released
subject, its values with their kinds and noisy counts ("payments gateway: team Team Heron
(31); version v2.28.5 (25)."). A question is answered in three public steps, no LM:

1. **the subject**: the released subjects the question names (whole words, case-folded; a
   subject inside a longer named one is left out); and when the question names a released
   value that is a name, that value's subject is a candidate too ("Velmora Dynamics
   employs Dara Quill" answers "Which company does Dara Quill work for?"). None: abstain.
2. **the kind it asks for**, by a public rule on the question's words (`QUESTION_KINDS`):
   "What is the IP address of ..." asks an ``ip`` or a ``host``, "When ..." a time window,
   "Which company ..." an organisation, "Who ..." a person, a team or a name. A question
   no rule reads is not answered (which relation it asks is unknown).
3. **the value the release supports**: the subject's values of those kinds, by noisy
   count (a question naming m subjects, "Which disease causes A and B?", adds each value's
   counts over them). The answer is the first when it leads the second by at least `GAP`
   noise standard deviations (the release's own, public; sqrt(m) of them for a sum of m
   counts); otherwise, or when no value has the kind asked,
   the answer abstains: a release that cannot tell names nothing, rather than a value of
   another relation.

What it cannot tell: two relations whose values have the same kind (a subject's keeper and
its contact, both people) are told apart only by their counts; a question about a relation
the collection never states is answered when the subject has a value of the kind it asks
for ("Who approved the budget for X?" when X has a team).

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

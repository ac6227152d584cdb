"""Answer a question from a fact release: find what it names, let the public LM pick a partner.

A fact release (`synthgen.knowledge.facts`) holds one synthetic record per released key
phrase, listing the phrases stated with it ("Dara Quill: Velmora Dynamics; Poswick; 1970.").
A question is answered in three public steps: (1) the released phrases it names (none: the
answer abstains); (2) the candidates, those phrases' released partners not named by the
question (with several phrases named, the partners most of them share); (3) the public LM
scores each candidate as the answer to a plain "Question: ... Answer:" prompt, less its
score after an empty question (domain-conditional PMI, Holtzman et al. 2021), and the best
is the answer. On the validation domain (people, 30 questions) PMI typed 25 right, against
10 by plain log-probability and 13 with the records in a chat prompt. The LM only types
("company" -> "Velmora Dynamics"); every answer is a released phrase.

Privacy:
  Reads only the release (DP outputs); post-processing, charges nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from synthgen.knowledge.phrases import question_phrases

ABSTAIN = "The release holds nothing about this question."
INSTRUCTION = "Answer the question."


@dataclasses.dataclass(frozen=True)
class FactAnswer:
    """The answer (`ABSTAIN` when nothing fits), the records read, the candidates' scores."""

    answer: str
    records: list[str]
    abstained: bool
    scores: dict[str, float]


class FactAnswerer:
    """Answers questions from a fact release's records (``{"topic", "partners", "text"}``)."""

    def __init__(self, records: Sequence[dict], lm) -> None:
        self.records = {r["topic"]: r for r in records}
        self.lm = lm

    def _prompt(self, question: str) -> list[int]:
        return self.lm.encode(f"{INSTRUCTION}\nQuestion: {question}\nAnswer:", bos=True)

    def candidates(self, question: str) -> tuple[list[str], list[str]]:
        """(the records' topics the question names, their partners it does not name)."""
        named = question_phrases(question, list(self.records))
        said = {n.lower() for n in named}
        links: dict[str, int] = {}
        for topic in named:
            for partner in self.records[topic]["partners"]:
                if partner.lower() not in said:
                    links[partner] = links.get(partner, 0) + 1
        # a question naming several phrases asks what links them: partners of the most
        # named phrases first (on a one-name question, every partner)
        most = max(links.values(), default=0)
        return named, [p for p, n in links.items() if n == most]

    def answer(self, question: str) -> FactAnswer:
        from synthgen.lm_backends import continuation_logprobs

        named, candidates = self.candidates(question)
        if not candidates:
            return FactAnswer(ABSTAIN, [], True, {})
        if len(candidates) == 1:
            return FactAnswer(candidates[0], named, False, {candidates[0]: 0.0})
        forms = [self.lm.encode(" " + c) for c in candidates]
        asked, neutral = np.asarray(
            continuation_logprobs(self.lm, [self._prompt(question), self._prompt("")], forms)
        )
        gain = asked - neutral  # what the question adds: not how likely a number is anyway
        scores = {c: float(s) for c, s in zip(candidates, gain, strict=True)}
        best = candidates[int(np.argmax(gain))]
        return FactAnswer(best, named, False, scores)

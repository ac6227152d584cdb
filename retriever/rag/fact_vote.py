"""One DP answer from the typed facts every document states (the ``facts`` mechanism).

No LM reads a private document. Every document of the collection (not only those the DP
threshold selects, which is still drawn and charged: the plan is keywords') votes for at
most K distinct values its own typed facts (`synthgen.knowledge.typed_facts`) state about
what the question asks (`document_votes`). One DP partition selection with noisy counts
releases the values many documents give; the answer is the first when it leads the second
by `GAP` noise standard deviations, else it abstains. See docs/guides/dp_rag.md ("facts:
every document votes the values its typed facts give").

Privacy:
  Unit: one document, add/remove-one. A document's votes are a function of its own text
  and the public question, at most K distinct keys; adding or removing a document adds or
  removes one voter, with no cap or selection shared with other documents. So the partition
  selection (`synthgen.privacy.partition_selection`: PipelineDP Gaussian counts with
  post-aggregation thresholding, L2 sensitivity sqrt(K)) at the plan's (token_epsilon,
  token_delta) is the answer's whole event; the choice and the abstention are
  post-processing. A value only one document gives is released with probability at most
  token_delta. Not covered (as for keywords): the extraction's running time grows with how
  many documents name the question's subject, which a timing observer could read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from retriever.rag import question_kinds as qk
from synthgen.knowledge.typed_facts import (
    FUNCTION_WORDS,
    TypedFact,
    normal,
    record_facts,
    stem,
    value_kind,
)
from synthgen.privacy.partition_selection import noise_stddev, release_key_counts

RELATIONS = ("kind", "words")  # how a fact must match the question's relation
MAX_READ_FACTS = 64  # facts of one document a voter reads (public: bounds its time)
_WORD = re.compile(r"[A-Za-z][\w'-]*")


def document_votes(
    facts: Sequence[TypedFact], question: str, max_votes: int, relation: str = "kind"
) -> list[str]:
    """The values one document votes for (at most `max_votes`, distinct).

    A fact whose subject the question names and whose value has the kind asked
    (`retriever.rag.question_kinds`) votes its value; one whose value the question names
    votes its subject. For a question no kind rule reads, the fact's relation words must
    share a stem with the question's (``relation="words"``: also when a kind rule reads it).

    Args:
      facts: the document's typed facts (`record_facts`), in reading order.
      question: the public question.
      max_votes: K.
      relation: "kind" or "words" (above).
    """
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation=}")
    low = question.lower()
    kinds = qk.question_kinds(question)
    asked = {stem(w) for w in _WORD.findall(question) if w.lower() not in FUNCTION_WORDS}

    strong: list[str] = []  # relation words overlap the question's
    weak: list[str] = []
    for fact in facts:
        subject, value = normal(fact.subject), fact.value.strip()
        kind = value_kind(value) if fact.kind == "name" else fact.kind  # org, place, person
        overlap = bool(asked & {stem(w) for w in fact.words})
        named_subject = bool(subject) and re.search(qk.whole_words(subject), low) is not None
        named_subject &= not qk.relation_noun(question, subject)  # "the keeper of ..."
        named_value = re.search(qk.whole_words(value.lower()), low) is not None
        if named_subject and not named_value:
            vote = value if (kind in kinds if kinds else overlap) else None
        elif kind in qk.NAME_KINDS and named_value and not named_subject:
            # the question names the value: its subject is the answer
            vote = re.sub(r"^[Tt]he ", "", fact.subject.strip())
            vote = vote if (value_kind(vote) in kinds if kinds else overlap) else None
        else:
            vote = None
        if vote is None or (relation == "words" and kinds and not overlap):
            continue
        (strong if overlap else weak).append(vote)
    return list(dict.fromkeys(strong + weak))[:max_votes]


def document_facts(texts: Sequence[str]) -> list[list[TypedFact]]:
    """Each document's typed facts (at most `MAX_READ_FACTS`), computed once per collection
    (private: memory only, never saved or logged)."""
    return [record_facts(text, MAX_READ_FACTS) for text in texts]


def fact_vote(
    facts: Sequence[Sequence[TypedFact]],
    question: str,
    *,
    epsilon: float,
    delta: float,
    max_votes: int = 1,
    relation: str = "kind",
    gap: float = qk.GAP,
) -> tuple[str | None, dict[str, float]]:
    """(the answer or None to abstain, the released values' noisy counts).

    Args:
      facts: every document's typed facts (`document_facts`), one voter each.
      question: the public question.
      epsilon, delta: the selection's parameters (one document).
      max_votes: K, most values one document gives.
      relation: "kind" or "words" (`document_votes`).
      gap: noise standard deviations the first value must lead the second by.

    Privacy:
      (epsilon, delta)-DP for one document (module docstring).
    """
    votes = [document_votes(f, question, max_votes, relation) for f in facts]
    release = release_key_counts(votes, epsilon=epsilon, delta=delta, max_keys=max_votes)
    counts = {str(k): float(v) for k, v in release.counts.items()}
    return qk.decide(counts, gap * noise_stddev(epsilon, delta, max_votes)), counts

"""Answer-level aggregation: release the keywords many voters' answers share (DP-KSA).

Token-by-token aggregation makes a 2-4-token invented name win a vote at every token over
the whole vocabulary. Most questions are answered by a few keywords (DP-KSA, arXiv
2602.14374), so here each voter answers the whole question from its own document, its
answer is reduced to at most K normalised keywords (`answer_keywords`), and one DP
partition selection releases the keywords that many voters share (`release_answer_keywords`,
through `synthgen.privacy.partition_selection`, the same PipelineDP release as the knowledge
release's keywords). The public LM then writes the final answer from the question and the
released keywords only (`keyword_document`: post-processing). Nothing released: the answer
abstains.

Privacy:
  Unit: one document, add/remove-one, given the released retrieval threshold. A voter's
  answer depends on its own document only (or its own group of documents with
  `RagConfig.documents_per_voter` > 1: a document's group is a public hash of its id,
  `retrieval.grouped_selected`), and it contributes each keyword at most once and at most
  K keywords. Adding or removing a document adds or removes one voter, or changes one
  (the voters' cap binds, or its group changes): two units of
  PipelineDP's add/remove analysis. So the selection runs at (epsilon / 2,
  delta / (1 + e^(epsilon / 2))), which group privacy turns into (epsilon, delta) for
  one document (as `retriever.rag.voting.dp_vote_token` does for LimitedDomain). The
  answer is charged that one (epsilon, delta) event. The noise is python-dp's own (OS
  entropy): a seeded `DPRag` does not replay it. Not covered: PipelineDP's running time
  grows with the number of voters' keywords, which a timing observer could read (the
  token mechanisms run at a fixed shape instead).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from retriever.lexical import QUESTION_WORDS
from synthgen.privacy.partition_selection import release_key_counts, selection_threshold

# Words that carry no fact: articles, auxiliaries, question words, the answer's framing
# ("the most likely cause is ..."), and every word `retriever.lexical` treats as a
# question's phrasing. Checked before and after normalising ("does" is not "doe").
STOPWORDS = QUESTION_WORDS | frozenset(
    "a an the and or of in on at to for with by from as is are was were be been it its this "
    "that these those which what who whom whose when where why how patient patients disease "
    "diseases diagnosis answer record records question i you he she they we not no yes "
    "treated treatment prescribed diagnosed reported presented came had has have then so "
    "also most likely probably possibly based suffering condition conditions illness case "
    "called named known".split()
)
_WORD = re.compile(r"[^\W\d_][^\W_]*")


def normalise(word: str) -> str:
    """Lower case, and a regular plural made singular ("blisters" -> "blister")."""
    word = word.lower()
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "is", "us", "os")):
        return word[:-1]
    return word


def answer_keywords(
    answer: str,
    max_keywords: int,
    question: str = "",
    word_tokens: Callable[[str], int] | None = None,
) -> list[str]:
    """A voter's keywords: at most `max_keywords` distinct normalised words of its answer
    that are neither stopwords nor words of the (public) question: a voter that echoes the
    question's words ("tadrunic numbness") says nothing the question did not (empty: none).

    Args:
      answer: the voter's answer.
      max_keywords: K.
      question: the public question.
      word_tokens: a public tokenizer's token count of a word: the rarest words (most
        tokens) are kept first, so that a name beats the answer's framing ("the disease
        causing ... is Zotrilosis" gives "zotrilosis", not "causing"); ties and None keep
        the answer's order.
    """
    asked = {normalise(w) for w in _WORD.findall(question)}
    candidates: list[tuple[str, str]] = []
    for word in _WORD.findall(answer):
        key = normalise(word)
        if word.lower() in STOPWORDS or key in STOPWORDS:
            continue
        if len(key) > 1 and key not in asked and key not in (k for k, _ in candidates):
            candidates.append((key, word))
    if word_tokens is not None:
        candidates.sort(key=lambda c: -word_tokens(c[1]))  # stable: ties keep their order
    return [key for key, _ in candidates[:max_keywords]]


def group_parameters(epsilon: float, delta: float) -> tuple[float, float]:
    """(epsilon', delta') per voter such that a swap of two voters is (epsilon, delta)."""
    return epsilon / 2.0, delta / (1.0 + math.exp(epsilon / 2.0))


def keyword_threshold(epsilon: float, delta: float, max_keywords: int) -> float:
    """Votes a keyword needs to be released at the answer's (epsilon, delta) (public)."""
    return selection_threshold(*group_parameters(epsilon, delta), max_keywords)


def release_answer_keywords(
    answers: Sequence[str],
    *,
    epsilon: float,
    delta: float,
    max_keywords: int,
    question: str = "",
    word_tokens: Callable[[str], int] | None = None,
) -> list[str]:
    """The keywords that many voters' answers share, by descending noisy count ([]: none).

    Args:
      answers: each voter's own answer (one voter per document; padding rows excluded).
      epsilon: the release's epsilon for one document.
      delta: its delta.
      max_keywords: K, most keywords one voter contributes (public).
      question: the public question; its words are not keywords.
      word_tokens: a public tokenizer's token count of a word (`answer_keywords`).

    Privacy:
      (epsilon, delta)-DP for one document (module docstring).
    """
    eps, dlt = group_parameters(epsilon, delta)
    keys = [answer_keywords(a, max_keywords, question, word_tokens) for a in answers]
    release = release_key_counts(keys, epsilon=eps, delta=dlt, max_keys=max_keywords)
    return [str(k) for k in release.counts]


def keyword_document(keywords: Sequence[str]) -> str:
    """The one document the public LM answers from: the released keywords, most shared first."""
    return "Keywords from the records, most shared first: " + ", ".join(keywords) + "."


def final_answer(text: str, keywords: Sequence[str]) -> str:
    """The public LM's answer `text` when it names a released keyword; otherwise the most
    shared keyword itself (post-processing of released keywords and public text)."""
    said = {normalise(w) for w in _WORD.findall(text)}
    if keywords and not said & set(keywords):
        return keywords[0].capitalize()
    return text

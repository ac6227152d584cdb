"""Answer-level aggregation: release the keywords many voters' answers share (DP-KSA).

Each voter answers from its own document (DP-KSA, arXiv 2602.14374), reduced to at most K
keys (`answer_keywords`); one DP partition selection releases the keys many voters share
(`release_answer_keywords`), and the public LM answers from the question and those keys
only (`keyword_document`: post-processing); nothing released abstains. See
docs/guides/dp_rag.md ("keywords: one partition selection over the voters' keywords").

Privacy:
  Unit: one document, add/remove-one, given the released retrieval threshold. A voter's
  keys are a function of its own document (or group, chosen by a public hash of the ids:
  `retrieval.grouped_selected`), its answer and the public question and tokenizer: at most
  K distinct keys, whatever a key is. A document adds, removes or changes one voter (the
  voters' cap binds, or its group changes): two units of PipelineDP's add/remove analysis,
  so the selection runs at (epsilon / 2, delta / (1 + e^(epsilon / 2))), which group
  privacy turns into the one (epsilon, delta) event charged (`group_parameters`). The noise
  is python-dp's own (OS entropy): a seeded `DPRag` does not replay it. Not covered:
  PipelineDP's running time grows with the voters' keywords (a timing channel).
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
# A word: letters or digits ("Ferpil", "1988"; "$639" gives "639"). A number is an answer
# too (a year, a price, a length), so digits are words; one character is never a keyword.
_WORD = re.compile(r"[^\W_]+")


def normalise(word: str) -> str:
    """Lower case, and a regular plural made singular ("blisters" -> "blister")."""
    word = word.lower()
    if word.isdigit():
        return word
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "is", "us", "os")):
        return word[:-1]
    return word


def _spelled(text: str) -> set[str]:
    """Every word of `text`, lower case and normalised."""
    words = _WORD.findall(text)
    return {w.lower() for w in words} | {normalise(w) for w in words}


def question_focus(question: str, word_tokens: Callable[[str], int] | None = None) -> set[str]:
    """The question's rarest content words (normalised): those with the most tokens under
    a public tokenizer ("Kelmos", "Brunkon" of "Which company does Kelmos Brunkon work
    for?"), every content word without one; empty when it has none (public)."""
    words = [
        (w, normalise(w))
        for w in _WORD.findall(question)
        if w.lower() not in STOPWORDS and normalise(w) not in STOPWORDS and len(w) > 1
    ]
    if not words or word_tokens is None:
        return {key for _, key in words}
    most = max(word_tokens(w) for w, _ in words)
    return {key for w, key in words if word_tokens(w) == most}


def answer_keywords(
    answer: str,
    max_keywords: int,
    question: str = "",
    word_tokens: Callable[[str], int] | None = None,
    document: str | None = None,
) -> list[str]:
    """A voter's keywords: at most `max_keywords` distinct normalised keys of its answer.

    A key is a content word of the answer (neither a stopword nor a word of the public
    question, which says nothing the question did not), a number ("$639" gives "639"), or,
    for a capitalised word, the run of capitalised content words around it that only
    spaces separate, as one key ("works at Ferpil Industries." gives "ferpil industries").

    Args:
      answer: the voter's answer.
      max_keywords: K.
      question: the public question.
      word_tokens: a public tokenizer's token count of a word: the keys of the rarest words
        (most tokens) come first, so a name beats the answer's framing ("the disease
        causing ... is Zotrilosis" gives "zotrilosis"); ties and None keep the order.
      document: the text the voter read (None: no check). A voter whose document holds
        none of the question's rarest words (`question_focus`) read about something else
        and gives no key, and a key its document does not spell ("2018" for a birth year
        the document never states) is the LM's, not the document's, and is dropped.
    """
    if document is not None:
        read = _spelled(document)
        focus = question_focus(question, word_tokens)
        if focus and not focus & read:
            return []
    asked = {normalise(w) for w in _WORD.findall(question)}
    matches = list(_WORD.finditer(answer))
    content = []  # (word, key) of every word, key None where it is no content word
    for m in matches:
        word = m.group()
        key = normalise(word)
        stop = word.lower() in STOPWORDS or key in STOPWORDS or key in asked or len(key) < 2
        content.append((word, None if stop else key))

    def joined(i: int, j: int) -> bool:  # words i and j = i + 1 are one name's parts
        gap = answer[matches[i].end() : matches[j].start()]
        return gap.strip(" ") == "" and all(
            content[n][1] is not None and content[n][0][:1].isupper() for n in (i, j)
        )

    candidates: list[tuple[str, str]] = []  # (key, the word that ranks it)
    for i, (word, key) in enumerate(content):
        if key is None:
            continue
        start = end = i
        while start > 0 and joined(start - 1, start):
            start -= 1
        while end + 1 < len(content) and joined(end, end + 1):
            end += 1
        # a name of several words keeps their spelling (lower case): "Ferpil Industries"
        # is not "ferpil industry"; one word is normalised as before
        name = (
            key if start == end else " ".join(content[n][0].lower() for n in range(start, end + 1))
        )
        grounded = document is None or set(name.split()) <= read
        if grounded and name not in (k for k, _ in candidates):
            candidates.append((name, word))
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
    documents: Sequence[str] | None = None,
) -> list[str]:
    """The keywords that many voters' answers share, by descending noisy count ([]: none).

    Args:
      answers: each voter's own answer (one voter per document; padding rows excluded).
      epsilon, delta: the release's, for one document.
      max_keywords: K, most keywords one voter contributes (public).
      question: the public question; its words are not keywords.
      word_tokens: a public tokenizer's token count of a word (`answer_keywords`).
      documents: the text each voter read, in the order of `answers` (None: keys are
        not checked against them; `answer_keywords`).

    Privacy:
      (epsilon, delta)-DP for one document (module docstring).
    """
    eps, dlt = group_parameters(epsilon, delta)
    if documents is not None and len(documents) != len(answers):
        raise ValueError("one document per answer")  # no count: voters are private
    read = [None] * len(answers) if documents is None else list(documents)
    keys = [
        answer_keywords(a, max_keywords, question, word_tokens, d)
        for a, d in zip(answers, read, strict=True)
    ]
    release = release_key_counts(keys, epsilon=eps, delta=dlt, max_keys=max_keywords)
    return [str(k) for k in release.counts]


def keyword_document(keywords: Sequence[str]) -> str:
    """The one document the public LM answers from: the released keywords, most shared first."""
    return "Keywords from the records, most shared first: " + ", ".join(keywords) + "."


def final_answer(text: str, keywords: Sequence[str]) -> str:
    """The public LM's answer `text` when it names a released keyword (every word of it);
    otherwise the most shared keyword itself, each word capitalised (post-processing of
    released keywords and public text)."""
    said = _spelled(text)
    if keywords and not any(set(k.split()) <= said for k in keywords):
        return " ".join(w.capitalize() for w in keywords[0].split())
    return text

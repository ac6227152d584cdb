"""Key phrases and fact pairs of one record, by a public rule that reads that record only.

What carries a fact about a private entity is its name and the values stated with it:
invented or rare words, proper nouns, numbers and prices. A word is a *key word* when

* it is a number (``1987``, ``$249``, ``4.5``), or a unit of at most three letters right
  after one (``190 cm``), or
* it is rare in English: its `wordfreq` Zipf frequency is below `RARE_ZIPF` (an invented
  name scores 0), or
* it is capitalised inside a sentence (a proper noun: "Velmora *Dynamics*"), or opens a
  sentence and the word after it is a capitalised key word ("*Maria* Lopez").

A *key phrase* is a run of adjacent key words in one sentence ("Velmora Dynamics"). A
record's *fact pairs* are the unordered pairs of key phrases that share a sentence, nearest
first, then pairs across sentences (`record_pairs`).

Privacy:
  Reads one record at a time and public word frequencies (`wordfreq`, fixed before any
  record is read), so a record's phrases and pairs are a function of that record alone,
  the per-record contribution of the DP set union (`synthgen.knowledge.facts`); releases
  nothing itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

RARE_ZIPF = 3.0  # Zipf frequency (log10 per billion words) below which a word is rare
PROPER_ZIPF = 6.0  # a capitalised word inside a sentence is a key word below this ("I" is not)
SEPARATOR = " | "  # joins a pair's two phrases into one key

_SENTENCE = re.compile(r"(?<=[.!?;:])\s+")
_TOKEN = re.compile(r"\$?\d+(?:,\d{3})*(?:\.\d+)?%?|[^\W\d_][\w'’-]*|[^\w\s]")


@functools.lru_cache(maxsize=200_000)
def zipf(word: str) -> float:
    """Public English Zipf frequency of `word` (0 for a word wordfreq has never seen)."""
    from wordfreq import zipf_frequency

    return float(zipf_frequency(word.lower(), "en"))


def _clean(token: str) -> str:
    token = re.sub(r"['’]s$", "", token)
    return token.rstrip(",.").rstrip("-'’")


def _is_number(token: str) -> bool:
    return bool(re.match(r"\$?\d", token))


_FUNCTION_WORDS = frozenset(
    "a an and are as at be by for if in is it of on or per so the to up was".split()
)


def _is_unit(token: str) -> bool:
    """A short word after a number that is no function word: a unit ("cm", "kg", "mph")."""
    return token.isalpha() and len(token) <= 3 and token.lower() not in _FUNCTION_WORDS


def sentence_phrases(sentence: str) -> list[str]:
    """The key phrases of one sentence, in reading order."""
    tokens = _TOKEN.findall(sentence)
    words = [_clean(t) for t in tokens]
    first = next((i for i, t in enumerate(tokens) if re.match(r"\w|\$", t)), 0)

    def capital(i: int) -> bool:
        return words[i][:1].isupper()

    def key(i: int) -> bool:
        w = words[i]
        if not w or not re.match(r"\w|\$", w):
            return False
        if _is_number(w):
            return True
        if zipf(w) < RARE_ZIPF:
            return True
        if capital(i) and i != first:
            return zipf(w) < PROPER_ZIPF
        return False

    keys = [key(i) for i in range(len(words))]
    for i in range(1, len(words)):  # a unit after a number is part of it: "190 cm", "5 kg"
        if keys[i - 1] and _is_number(words[i - 1]) and _is_unit(words[i]):
            keys[i] = True
    if (  # "Maria Lopez works ...": a common first name opening the sentence
        len(words) > first + 1
        and not keys[first]
        and capital(first)
        and keys[first + 1]
        and capital(first + 1)
        and zipf(words[first]) < 5.0
    ):
        keys[first] = True
    phrases, run = [], []
    for i, w in enumerate(words):
        if keys[i]:
            run.append(w)
            continue
        if run:
            phrases.append(" ".join(run))
        run = []
    if run:
        phrases.append(" ".join(run))
    return list(dict.fromkeys(phrases))


def record_phrases(text: str) -> list[list[str]]:
    """Each sentence's key phrases (sentences split at . ! ? ; : followed by a space)."""
    return [sentence_phrases(s) for s in _SENTENCE.split(text.strip()) if s.strip()]


def pair_key(a: str, b: str) -> str:
    """One key for the unordered pair {a, b}."""
    return SEPARATOR.join(sorted((a, b)))


def split_pair(key: str) -> tuple[str, str]:
    a, b = key.split(SEPARATOR)
    return a, b


def record_pairs(text: str, max_pairs: int) -> list[str]:
    """A record's at most `max_pairs` fact pairs, nearest first: phrases of one sentence
    (adjacent, then two apart, ...), earlier sentences first; then phrases of different
    sentences (adjacent sentences first)."""
    sentences = record_phrases(text)
    pairs: list[str] = []
    for phrases in sentences:
        for gap in range(1, len(phrases)):
            for i in range(len(phrases) - gap):
                pairs.append(pair_key(phrases[i], phrases[i + gap]))
    for gap in range(1, len(sentences)):
        for i in range(len(sentences) - gap):
            pairs += [pair_key(a, b) for a in sentences[i] for b in sentences[i + gap]]
    pairs = [p for p in pairs if len({x.lower() for x in split_pair(p)}) == 2]
    return list(dict.fromkeys(pairs))[:max_pairs]


def question_phrases(question: str, known: Sequence[str]) -> list[str]:
    """The phrases of `known` that `question` names (case-insensitive, whole words),
    longest first; a phrase inside a longer named one is left out."""
    low = question.lower()
    found = []
    for phrase in sorted(known, key=len, reverse=True):
        pattern = r"(?<!\w)" + re.escape(phrase.lower()) + r"(?!\w)"
        if re.search(pattern, low) and not any(phrase.lower() in f.lower() for f in found):
            found.append(phrase)
    return found

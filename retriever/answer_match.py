"""Whether an answer names its expected answer: the scoring rule of DP-RAG answers.

The rule (case-insensitive, at word boundaries): the answer contains the full expected
answer, or its first word when that word has at least 5 characters and starts no other name
the collection could be asked about ("Besox" counts for "Besox fever"). The main job scores
its answers with it, and so do the DP-RAG evaluations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def _mentions(text: str, phrase: str) -> bool:
    """Whether `text` contains `phrase`, case-insensitive, at word boundaries."""
    return re.search(rf"(?<!\w){re.escape(phrase.lower())}(?!\w)", text.lower()) is not None


def answer_is_correct(answer_text: str, expected: str, *, others: Iterable[str] = ()) -> bool:
    """Whether an answer names the expected answer.

    Rule (case-insensitive, at word boundaries): the answer contains the full name, or its
    first word when that word has at least 5 characters and starts no other name in ``others``
    ("Besox" counts for "Besox fever"). Names whose first words are distinct (as in the
    fictional medical worlds, `dpsynth.evaluation.medical_world`) may leave ``others`` empty.

    Args:
      answer_text: the generated answer.
      expected: the expected answer (e.g. a disease name).
      others: the collection's other names, to check the first word is unique.

    Returns:
      True when the answer names `expected` by the rule above.
    """
    first = expected.split()[0].lower()
    clash = any(o.split()[0].lower() == first for o in others if o.lower() != expected.lower())
    partial = len(first) >= 5 and not clash and _mentions(answer_text, first)
    return partial or _mentions(answer_text, expected)

"""What kind of value a question asks for, and when counted candidates name an answer.

Public rules shared by the answers from a typed fact release (`retriever.typed_answers`)
and the single DP answers from typed facts (`retriever.rag.fact_vote`): `question_kinds`
reads the kinds of value a question asks for from its words ("Which team ..." a team,
"When ..." a time window); `decide` names the candidate with the largest noisy count when it
leads the second by a margin, and nothing otherwise.

Privacy:
  Reads the public question and released counts only.
"""

from __future__ import annotations

import re

GAP = 1.0  # noise standard deviations the first value must lead by (chosen on validation)

# (pattern on the lower-cased question, the kinds it asks for), first match wins.
QUESTION_KINDS: tuple[tuple[str, frozenset[str]], ...] = tuple(
    (pattern, frozenset(kinds.split()))
    for pattern, kinds in (
        (r"\bip\b|\baddress\b", "ip host"),
        (r"\bversion\b", "version"),
        (r"\bwhen (?:was|were|did)\b", "year"),  # a past event: a date, not a window
        (r"\bwhen\b|\bschedule\b|\bwindow\b|what time", "window"),
        (r"\byear\b", "year"),
        (r"how long is|\blength\b|how tall|how big|how heavy|\bsize\b", "measure"),
        (r"how long|how often|\binterval\b|\bretention\b|\bkept\b|\bduration\b", "duration"),
        (r"how many|\bcapacity\b", "count"),
        (r"how much|\bcost\b|\bprice\b", "money"),
        (r"\bteam\b", "team"),
        (
            r"\bcompany\b|\bemploy|\bwork (?:for|at)\b|\bmakes?\b|\bmanufactur|\bvendor\b"
            r"|\bsupplier\b|\bbrand\b|\bfirm\b",
            "org",
        ),
        (r"\bcode\b|\bpassword\b", "item name"),
        (r"\bdisease\b|\bdiagnos|\billness\b|\bcondition\b|\bsyndrome\b", "name place"),
        (r"\bwho\b|\bwhom\b", "person team name"),
        (r"\bshare\b|\bdata\b|\bsaves?\b|\bwrites?\b", "share host"),
        (
            r"\bwhere\b|\broom\b|\btown\b|\bcity\b|\bcountry\b|\blocated\b|\bgrow up\b"
            r"|\bhometown\b|\bhabitat\b|\blive\b|\bsite\b|\blocation\b",
            "room place name",  # where a thing is; where data is: the share rule above
        ),
    )
)


NAME_KINDS = frozenset("person org place name team".split())  # kinds a question may name


def whole_words(text: str) -> str:
    """A regex of `text` as whole words."""
    return r"(?<![\w-])" + re.escape(text) + r"(?![\w-])"


def relation_noun(question: str, subject: str) -> bool:
    """Whether `question` uses `subject` as the relation in "the <subject> of|for ..."
    ("Who is the keeper of the autoclave?": "keeper" is asked of the autoclave, not asked
    about): such a subject is not what the question names (public)."""
    return (
        re.search(whole_words(subject.lower()) + r"\s+(?:of|for)\s", question.lower()) is not None
    )


def question_kinds(question: str) -> frozenset[str]:
    """The kinds of value `question` asks for (`QUESTION_KINDS`); empty: none known."""
    low = question.lower()
    for pattern, kinds in QUESTION_KINDS:
        if re.search(pattern, low):
            return kinds
    return frozenset()


def decide(counts: dict[str, float], margin: float) -> str | None:
    """The candidate with the largest count when it leads the second by at least `margin`;
    None otherwise or when there is none (ties broken by the text: public)."""
    ranked = sorted(counts.items(), key=lambda vc: (-vc[1], vc[0]))
    if not ranked or (len(ranked) > 1 and ranked[0][1] - ranked[1][1] < margin):
        return None
    return ranked[0][0]

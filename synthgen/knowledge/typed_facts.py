"""Typed facts of one record, by a public rule that reads that record only.

A fact is (subject, relation, value): "Team Heron owns the payments gateway" states
(payments gateway, owns, Team Heron). The rule drops what is not a statement (headers,
chat and note prefixes, greetings, sign-offs, dates and timestamps), finds typed values
whole (`VALUE_KINDS`; proper names through `synthgen.knowledge.phrases`) and binds each to
the subject it is said of; see docs/guides/knowledge.md ("The fact release", "Limits").
Details the guide leaves out: each item of a list of names states a fact with the first
name after the list (ranked after typed values, before other names, when K is applied); a
link between two proper names is kept in one (alphabetical) order whatever the phrasing,
so its records pool; calendar words are never names; `TypedFact.words` (the sentence's
other content words, lower-cased, ``-s``/``-ed`` stripped) is for diagnostics and tests,
never released. A record is read up to `MAX_RECORD_CHARS` characters and a statement up
to `MAX_STATEMENT_CHARS`, so the rule's time is bounded by public figures.

Privacy:
  Reads one record at a time and public word lists fixed before any record is read, so a
  record's facts are a function of that record alone (the per-record contribution of the
  DP selection in `synthgen.knowledge.facts`); releases nothing itself.
"""

from __future__ import annotations

import dataclasses
import re

from synthgen.knowledge.phrases import sentence_phrases, zipf

# (kind, pattern) in priority order: an earlier kind's span hides later matches inside it.
_DAYS = r"(?:(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)days?|daily|weekdays|weekends|nightly)"
VALUE_KINDS: tuple[tuple[str, str], ...] = (
    ("ip", r"\b\d{1,3}(?:\.\d{1,3}){3}(?:/\d{1,2})?\b"),
    ("window", _DAYS + r"?\s*\d{1,2}:\d{2}\s*[-\u2013]\s*\d{1,2}:\d{2}(?:\s*(?:UTC|GMT|CET))?"),
    ("share", r"\\\\[\w.$-]*[\w$-](?:\\[\w.$-]*[\w$-])+"),
    ("host", r"\b[a-z][\w-]*(?:\.[a-z][\w-]*)*\.(?:com|org|net|io|internal|local|lan|corp)\b"),
    ("version", r"\bv\d+(?:\.\d+)*\b|\b\d+\.\d+\.\d+\b"),
    ("room", r"\b(?:[Rr]oom|[Ff]loor|[Bb]uilding)\s+\d+(?:\.\d+)?\b"),
    ("money", r"[$\u20ac\u00a3]\s?\d+(?:[.,]\d+)*"),
    (
        "duration",
        r"\b\d+(?:\.\d+)?\s?(?:seconds|minutes|hours|days|weeks|months|years|"
        r"second|minute|hour|day|week|month|year)\b",
    ),
    ("count", r"\b\d+\s?(?:people|persons|seats|users|desks|guests|members)\b"),
    ("measure", r"\b\d+(?:\.\d+)?\s?(?:cm|mm|km|kg|GB|TB|MB|ms|m|g|%|\u00b0C)(?!\w)"),
    ("team", r"\bTeam\s+[A-Z][\w-]+"),
    ("year", r"\b(?:1[6-9]|20)\d{2}\b"),
)
_VALUE_RES = tuple((kind, re.compile(pattern)) for kind, pattern in VALUE_KINDS)

# Lines that are metadata, not statements.
_HEADER = re.compile(
    r"^\s*(?:subject|from|to|cc|bcc|date|sent|priority|category|status|opened|closed|"
    r"assignee|reporter|ticket|severity|labels?|re)\s*[:#]",
    re.IGNORECASE,
)
_PREFIX = re.compile(  # "[09:42] dana:", "note 2026-06-05 from sam:", "2026-06-05 14:02 -"
    r"^\s*(?:\[\d{1,2}:\d{2}(?::\d{2})?\]\s*[\w.-]+:\s*|"
    r"(?:note|update|log)\s+\d{4}-\d{2}-\d{2}(?:\s+from\s+[\w.-]+)?\s*:\s*)",
    re.IGNORECASE,
)
_STAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2})?)?\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    r"|(?<![\d:-])\b\d{1,2}:\d{2}(?::\d{2})?\b(?!\s*[-\u2013]\s*\d)"
)
_SALUTATION = re.compile(
    r"^\s*(?:hi|hello|hey|dear|morning|good morning|thanks|thank you|cheers|best|regards|"
    r"best regards|kind regards|many thanks)\b[^.!?]{0,30}[,!]?\s*$",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
_WORD = re.compile(r"[A-Za-z][\w'-]*")

FUNCTION_WORDS = frozenset(
    """a an and are as at be been being but by can could did do does for from had has have
    how i if in into is it its may might more most my no not now of on or our out over per
    should so than that the their them then there these they this those through to too up
    us was we were what when where which while who whom whose why will with would you your
    also just still only very any some all each every about after again before new next
    last first one two three week day today yesterday tomorrow please thx thanks""".split()
)
# Common English verbs (base forms, public): a subject noun phrase ends before one.
_VERBS = frozenset(
    """be have do go get make keep run own live answer sit hold fit open write save move
    take give look ask use manage clean patch upgrade update calibrate book train reach
    find put set come see know say tell need want work build sell cost measure grow lead
    employ release produce assemble describe discover record identify visit spend happen
    land retain store host serve handle cover support belong report allow let show call
    send check start stop break fail drop delay arrive leave replace install restart""".split()
)
_MAX_SUBJECT_WORDS = 4
MAX_RECORD_CHARS = 20_000  # characters of a record the rule reads (public)
MAX_STATEMENT_CHARS = 1_000  # characters of one statement it reads (public)
SEPARATOR = " | "  # joins a fact's subject and value into one key (ordered: subject first)
# Public word lists that type a proper name by its last word (generic English).
ORG_SUFFIXES = frozenset(
    """inc ltd llc gmbh ag sa plc corp corporation company co group holdings labs
    laboratories systems dynamics industries works partners technologies solutions software
    university institute bank foundation associates enterprises studios media networks
    consulting logistics pharma motors airlines""".split()
)
PLACE_SUFFIXES = frozenset(
    """uplands highlands lowlands marshes wetlands valley river lake mountains hills islands
    island coast bay forest desert plains basin fields moor moors heath woods park street
    road square county province district region""".split()
)
# What each kind of value is called in a released record.
KIND_LABELS = {
    "ip": "IP address", "window": "time window", "share": "share", "host": "host",
    "version": "version", "room": "room", "money": "price", "duration": "duration",
    "count": "count", "measure": "measure", "team": "team", "year": "year", "org":
    "organisation", "place": "place", "person": "person", "name": "name", "item": "value",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TypedFact:
    """One fact a record states: its subject and value (as written, spaces normalised),
    the value's kind (`VALUE_KINDS`, or ``name``) and the relation words around them."""

    subject: str
    value: str
    kind: str
    words: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str]:
        """(subject, value), case-folded: what records must share to pool."""
        return normal(self.subject), normal(self.value)


def _clean(text: str) -> str:
    """One space, en dashes as hyphens, stripped."""
    return re.sub(r"\s+", " ", text.replace("\u2013", "-")).strip()


def normal(text: str) -> str:
    """Lower case, one space, en dashes as hyphens, no leading "the"."""
    return re.sub(r"^the ", "", _clean(text).lower())


def stem(word: str) -> str:
    """A crude public stem: lower case without a plural/3rd-person -s, -ed or -ing."""
    w = word.lower().strip("'-")
    for end in ("ing", "ed", "es", "s"):
        if len(w) > len(end) + 2 and w.endswith(end) and not w.endswith("ss"):
            return w[: -len(end)]
    return w


def _is_verb(word: str) -> bool:
    w = word.lower()
    if w in FUNCTION_WORDS or w in _VERBS:
        return True
    return any(
        w.endswith(end) and w[: -len(end)] in _VERBS for end in ("s", "es", "ed", "d", "ing")
    ) or (w.endswith("ed") and len(w) > 4)


def statements(text: str) -> list[tuple[str, str | None]]:
    """The record's statements: (sentence, heading subject or None), metadata dropped.

    A checklist line ``- label: value`` becomes ``label: value`` with the subject of the
    nearest heading above it ("Handover notes for the incident bridge (...):").
    """
    out: list[tuple[str, str | None]] = []
    heading: str | None = None
    for raw in text[:MAX_RECORD_CHARS].splitlines():
        line = _PREFIX.sub("", raw)
        if not line.strip() or _HEADER.match(line) or _SALUTATION.match(line):
            continue
        if re.fullmatch(r"\s*[A-Z][a-z]+\s*", line):  # a signature: one capitalised word
            continue
        line = _STAMP.sub(" ", line)
        item = re.match(r"^\s*[-*\u2022]\s*([^:]{1,40}):\s*(.+)$", line)
        if item:
            out.append((f"{item.group(1).strip()}: {item.group(2).strip()}", heading))
            continue
        if line.rstrip().endswith(":"):  # a heading: its subject is the lines' below
            subjects = _subjects(line, [])
            heading = subjects[0][2] if subjects else None
            continue
        heading = None
        out += [(s[:MAX_STATEMENT_CHARS], None) for s in _SENTENCE.split(line) if s.strip()]
    return out


def _values(sentence: str) -> list[tuple[int, int, str, str]]:
    """(start, end, kind, text) of the sentence's typed values (not names), in order."""
    taken: list[tuple[int, int, str, str]] = []
    for kind, pattern in _VALUE_RES:
        for m in pattern.finditer(sentence):
            a, b = m.span()
            if not any(a < y and x < b for x, y, _, _ in taken):
                taken.append((a, b, kind, m.group(0).strip()))
    return sorted(taken)


# Calendar words are capitalised but name no entity: a date is not a fact (public list).
CALENDAR_WORDS = frozenset(
    """monday tuesday wednesday thursday friday saturday sunday mondays tuesdays wednesdays
    thursdays fridays saturdays sundays january february march april may june july august
    september october november december""".split()
)


def _names(sentence: str, taken: list) -> list[tuple[int, int, str, str]]:
    """Proper names (invented or rare words, capitalised runs) outside the spans taken;
    never a calendar word ("on Saturday morning", "in March")."""
    out: list[tuple[int, int, str, str]] = []
    for phrase in sentence_phrases(sentence):
        if re.search(r"\d", phrase) or all(w in CALENDAR_WORDS for w in phrase.lower().split()):
            continue
        for m in re.finditer(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", sentence):
            a, b = m.span()
            if not any(a < y and x < b for x, y, *_ in taken + out):
                out.append((a, b, "name", phrase))
    return out


def _subjects(sentence: str, values: list) -> list[tuple[int, int, str]]:
    """(start, end, text) of noun phrases opened by "the" (never inside a value)."""
    out = []
    for m in re.finditer(r"\b[Tt]he\s+", sentence):
        words, end = [], m.end()
        for w in _WORD.finditer(sentence, m.end()):
            word = w.group(0)
            inside = any(x <= w.start() < y for x, y, *_ in values)
            # right after "the" comes a noun or an adjective, never a verb ("the build farm")
            verb = word.lower() in FUNCTION_WORDS if not words else _is_verb(word)
            if w.start() != end or inside or verb:
                break
            if len(words) == _MAX_SUBJECT_WORDS:
                break
            lower_before = any(x[:1].islower() for x in words)
            if words and word[:1].isupper() and lower_before:  # "the year Dara Quill"
                break
            if word[:1].islower() and zipf(word) == 0 and not (words and words[-1][:1].isupper()):
                break  # a typo or an unknown word ends it ("the gateway moevd")
            words.append(w.group(0))
            end = w.end()
            if sentence[end : end + 1] == " ":
                end += 1
        if words:
            b = m.end() + len(" ".join(words))
            if not any(m.start() < y and x < b for x, y, _, _ in values):
                out.append((m.start(), b, "the " + " ".join(words)))
    return out


def record_facts(text: str, max_facts: int) -> list[TypedFact]:
    """A record's at most `max_facts` typed facts, each (subject, value) once: facts whose
    value is typed first, then those whose value is a proper name, then a noun phrase that
    holds one (module docstring); in reading order within each."""
    found: list[tuple[int, int, TypedFact]] = []
    said = statements(text)
    for order, (sentence, heading) in enumerate(said):
        typed = _values(sentence)
        item = re.fullmatch(r"([^:]{1,40}): (.{1,60})", sentence) if heading else None
        if item and not typed:  # a labelled item: its whole text is the value
            typed = [(item.start(2), item.end(2), "item", item.group(2).strip())]
        subjects = _subjects(sentence, typed)
        label = [(0, item.end(1), "label", "")] if item else []  # a relation, not a value
        named = _names(sentence, typed + label + [(a, b, "subject", t) for a, b, t in subjects])
        mentions = [(a, b, t) for a, b, t in subjects] + [(a, b, v) for a, b, _, v in named]
        proper = [(a, b, "name", t) for a, b, t in subjects if re.search(r" [A-Z]", t)]
        if heading is None:  # a list's items each state a fact with what follows it
            after = said[order + 1][0] if order + 1 < len(said) else ""
            for item, target in _list_facts(sentence, typed + named, after):
                words = _relation_words(sentence, item, target)
                fact = TypedFact(item, target, value_kind(target), words)
                if fact.key[0] and fact.key[0] != fact.key[1]:
                    found.append((1, False, order * 10_000 + sentence.find(item), fact))
        for rank, (a, b, kind, value) in [
            *((0, v) for v in typed),
            *((2, v) for v in named),
            *((3, v) for v in proper),
        ]:
            if heading is not None:
                subject = heading
            else:
                near = [m for m in mentions if (m[0], m[1]) != (a, b) and m[2] != value]
                strong = [m for m in near if not weak_subject(m[2])]
                near = strong or near
                if not near:
                    continue
                # the nearest mention, one before the value preferred (a clause's subject
                # mostly comes first: "the kitchen is in room 1.25, next to the lifts")
                subject = min(near, key=lambda m: a - m[1] if m[1] <= a else 3 * (m[0] - b))[2]
            if kind == "name" and _proper(subject) and normal(value) < normal(subject):
                # two proper names ("Dara Quill works at Velmora Dynamics", "Velmora
                # Dynamics employs Dara Quill"): one order whatever the phrasing, so that
                # the records stating the link pool
                subject, value = value, subject
            fact = TypedFact(subject, value, kind, _relation_words(sentence, subject, value))
            if fact.key[0] and fact.key[0] != fact.key[1]:
                # a name said after its subject first ("Dara Quill works at Velmora
                # Dynamics": the company is the value), then reading order
                before = rank > 0 and sentence.find(subject) > a
                found.append((rank, before, order * 10_000 + a, fact))
    facts, seen = [], set()
    for *_, fact in sorted(found, key=lambda f: f[:3]):
        if fact.key not in seen:
            seen.add(fact.key)
            facts.append(fact)
    return facts[:max_facts]


_LIST_GLUE = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or)\s*")


def _list_facts(sentence: str, values: list, after: str) -> list[tuple[str, str]]:
    """(item, target) for each item of a list of values ("A, B and C": two or more, the
    last joined by "and" or "or"): the target is the first value after the list in the
    same statement, else the first value of the next statement ("reported A, B and C
    and was diagnosed with D"; "presented with A, B and C. Diagnosis: D.")."""
    spans = [_with_head(sentence, a, b, v) for a, b, _, v in sorted(values)]
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(spans):
        j = i
        while j + 1 < len(spans) and _LIST_GLUE.fullmatch(sentence[spans[j][1] : spans[j + 1][0]]):
            j += 1
        last_glue = sentence[spans[j - 1][1] : spans[j][0]] if j > i else ""
        if j > i and re.search(r"\b(?:and|or)\b", last_glue):
            later = spans[j + 1 :]
            if later:
                target = later[0][2]
            else:
                nxt = _values(after)
                nxt += _names(after, nxt)
                target = _with_head(after, *min(nxt)[:2], min(nxt)[3])[2] if nxt else ""
            if target:
                out += [(v, target) for _, _, v in spans[i : j + 1] if v != target]
        i = j + 1
    return out


def _with_head(sentence: str, a: int, b: int, value: str) -> tuple[int, int, str]:
    """A name with the common noun right after it ("dalorish cramps", "Besox fever"): a
    lower-case word that is neither a function word nor a verb form."""
    m = re.match(r" ([a-z][a-z-]*)\b", sentence[b:])
    if m and m.group(1) not in FUNCTION_WORDS and not _is_verb(m.group(1)):
        return a, b + m.end(), value + " " + m.group(1)
    return a, b, value


def _proper(text: str) -> bool:
    """A proper name: capitalised, not opened by "the"."""
    return text[:1].isupper() and not re.match(r"[Tt]he ", text)


def weak_subject(subject: str) -> bool:
    """A one-word common noun ("the town", "the year"): a subject only when nothing else is."""
    words = normal(subject).split()
    return len(words) == 1 and subject.split()[-1].islower() and zipf(words[0]) >= 4.5


def _relation_words(sentence: str, subject: str, value: str) -> tuple[str, ...]:
    """Stems of the sentence's content words that are neither the subject's nor the
    value's (real words only: an invented word is no relation), at most six."""
    own = set(_WORD.findall(normal(subject))) | set(_WORD.findall(value.lower()))
    words = (
        stem(w)
        for w in _WORD.findall(sentence)
        if w.lower() not in FUNCTION_WORDS and w.lower() not in own and zipf(w) > 0
    )
    return tuple(dict.fromkeys(words))[:6]


def value_kind(value: str) -> str:
    """The kind of a value, from its text alone (public): the first of `VALUE_KINDS` whose
    pattern matches it whole; else a proper name typed by its last word (``org``,
    ``place``), a run of two or three capitalised words (``person``), another capitalised
    name (``name``), or anything else (``item``)."""
    text = value.strip()
    for kind, pattern in _VALUE_RES:
        if pattern.fullmatch(text):
            return kind
    words = text.split()
    if not words or not words[0][:1].isupper():
        return "item"
    last = words[-1].lower().strip(".")
    if last in ORG_SUFFIXES:
        return "org"
    if last in PLACE_SUFFIXES:
        return "place"
    if 2 <= len(words) <= 3 and all(w[:1].isupper() for w in words):
        return "person"
    return "place" if len(words) == 1 else "name"


def fact_key(subject: str, value: str) -> str:
    """One released key for a fact: ``subject | value``, spaces and dashes normalised, a
    leading "the" dropped from both, the case kept (a name stays a name)."""
    subject, value = (re.sub(r"^[Tt]he ", "", _clean(text)) for text in (subject, value))
    return subject + SEPARATOR + value


def split_fact(key: str) -> tuple[str, str]:
    """(subject, value) of a `fact_key`."""
    subject, value = key.split(SEPARATOR, 1)
    return subject, value


def record_fact_keys(text: str, max_facts: int) -> list[str]:
    """The `fact_key` of each of a record's at most `max_facts` typed facts (a value that
    holds the separator is never a key)."""
    keys = [fact_key(f.subject, f.value) for f in record_facts(text, max_facts * 4)]
    # a record's text states a fact as "subject: kind value (count); ...": a subject or
    # value holding one of those marks would not read back, so it is never a key
    usable = [k for k in keys if k.count(SEPARATOR) == 1 and not re.search(r"[;()]|: ", k)]
    return list(dict.fromkeys(usable))[:max_facts]


def parse_typed_text(text: str) -> dict | None:
    """``{"topic", "partners", "facts", "text"}`` of a typed record's text (as
    `synthgen.knowledge.facts.fact_records` writes it), or None when `text` is not one."""
    if not isinstance(text, str) or not text.endswith(").") or ": " not in text:
        return None
    topic, rest = text[:-1].split(": ", 1)
    labels = sorted(set(KIND_LABELS.values()), key=len, reverse=True)
    facts = []
    for part in rest.split("; "):
        m = re.fullmatch(r"(.+) \((\d+)\)", part)
        label = next((x for x in labels if m and m.group(1).startswith(x + " ")), None)
        if m is None or label is None:
            return None
        value = m.group(1)[len(label) + 1 :]
        facts.append({"value": value, "kind": value_kind(value), "count": float(m.group(2))})
    if not topic.strip() or not facts:
        return None
    return {"topic": topic, "partners": [f["value"] for f in facts], "facts": facts, "text": text}

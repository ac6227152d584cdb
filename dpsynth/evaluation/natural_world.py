"""Natural-text fact worlds: tickets, notes, e-mails and chats in which facts are buried.

The templated worlds (`dpsynth.evaluation.fact_world`) state one fact per short sentence; a
user's collection does not. A natural world states the same kind of typed facts (subject,
relation, value), each in a known number of documents, the way people write them down: in
five authors' styles (a formal ticket with a header, a terse dated note, a chat excerpt, an
e-mail with the fact buried among unrelated sentences, a checklist), with typos in the
ordinary words and dates and times everywhere; several facts per sentence ("Team Heron owns
the payments gateway, and ...") and per checklist; values of every kind (team names that
are English words, IP addresses, host names, versions, time windows, durations, people,
code names that are common words); subjects in plain English ("the password-reset tool");
filler documents that state no fact; and questions whose answer is in no release: every
fact stated in one document (a secret) and, per subject, a relation the collection never
states (answer "", support 0).

Helpdesk is the validation domain (defaults are chosen on it); facilities and lab are the
test domains, reported and never tuned on. Values are unique in a world (people and code
names drawn without replacement), so a released singleton can be found by string search.
`make_natural_world` returns the `fact_world.FactWorld` of the templated worlds, so every
evaluation reads both; ``retriever data facts --domain helpdesk --out DIR`` writes
``corpus.jsonl`` and ``questions.jsonl``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from dpsynth.evaluation import fact_world
from dpsynth.evaluation.fact_world import SUPPORT_LEVELS, Fact, FactQuestion, FactWorld

VALIDATION_DOMAIN = "helpdesk"
TEST_DOMAINS = ("facilities", "lab")

# Per relation: the value's kind, sentences (s: subject, o: value), a checklist label, the
# questions that ask it.
_HELPDESK = {
    "subjects": (
        "the payments gateway",
        "the password-reset tool",
        "the staging cluster",
        "the VPN concentrator",
        "the incident bridge",
        "the build farm",
        "the billing API",
        "the badge printer service",
        "the mail relay",
        "the HR portal",
        "the data warehouse",
        "the customer status page",
    ),
    "relations": {
        "owner": (
            "team",
            (
                "{o} owns {s}.",
                "{s} is owned by {o} now.",
                "ping {o}, they own {s}",
                "Ownership of {s} moved to {o} last quarter.",
                "{o} is responsible for {s}.",
            ),
            "owner",
            ("Which team owns {s}?", "Who is responsible for {s}?"),
        ),
        "address": (
            "ip",
            (
                "{s} lives at {o}.",
                "{s} answers on {o}.",
                "the IP for {s} is {o}",
                "You can reach {s} at {o} from the office network.",
            ),
            "ip",
            ("What is the IP address of {s}?", "Which address does {s} answer on?"),
        ),
        "window": (
            "window",
            (
                "The maintenance window for {s} is {o}.",
                "{s} goes down for patching {o}.",
                "reminder: {s} maintenance is {o}",
                "Patching of {s} happens {o}.",
            ),
            "maintenance",
            ("When is the maintenance window for {s}?", "When is {s} patched?"),
        ),
        "version": (
            "version",
            (
                "{s} runs {o}.",
                "{s} was upgraded to {o}.",
                "we're on {o} for {s}",
                "After the upgrade, {s} is at {o}.",
            ),
            "version",
            ("Which version does {s} run?", "What version is {s} on?"),
        ),
        "retention": (
            "duration",
            (
                "Logs of {s} are kept for {o}.",
                "{s} keeps its logs {o}.",
                "retention on {s} is {o}",
                "We retain the logs of {s} for {o}.",
            ),
            "log retention",
            ("How long are the logs of {s} kept?", "What is the log retention of {s}?"),
        ),
    },
    "never": (
        "Who approved the budget for {s}?",
        "Which vendor supplied the hardware of {s}?",
        "What is the disaster-recovery site of {s}?",
    ),
    "topics": ("Network", "Access", "Hardware", "Software", "Billing", "Security"),
    "fillers": (
        "I can't log in since this morning and the reset link has expired.",
        "The printer on the second floor is jamming again.",
        "My laptop fan is very loud after the last update.",
        "Could someone add me to the design mailing list?",
        "The coffee machine in the kitchen shows an error.",
        "Teams calls drop every few minutes when I'm on the guest wifi.",
        "Please extend my contractor account until the end of the month.",
        "The projector in the big room needs a new cable.",
        "Outlook keeps asking for my password.",
        "I ordered a second monitor two weeks ago and haven't heard back.",
    ),
}

_FACILITIES = {
    "subjects": (
        "the Juniper meeting room",
        "the third-floor kitchen",
        "the bike storage",
        "the north stairwell",
        "the mothers' room",
        "the loading dock",
        "the rooftop terrace",
        "the quiet library",
        "the east wing",
        "the parking garage",
        "the reception desk",
        "the server room",
    ),
    "relations": {
        "location": (
            "room",
            (
                "{s} is in {o}.",
                "You'll find {s} in {o}.",
                "{s} moved to {o}",
                "{s} is now located in {o}, next to the lifts.",
            ),
            "location",
            ("Where is {s}?", "Which room is {s} in?"),
        ),
        "capacity": (
            "people",
            (
                "{s} holds {o}.",
                "{s} fits {o} at most.",
                "max capacity of {s}: {o}",
                "Fire rules allow {o} in {s}.",
            ),
            "capacity",
            ("How many people does {s} hold?", "What is the capacity of {s}?"),
        ),
        "contact": (
            "person",
            (
                "{o} looks after {s}.",
                "Questions about {s} go to {o}.",
                "ask {o} about {s}",
                "{o} manages bookings for {s}.",
            ),
            "contact",
            ("Who looks after {s}?", "Who should I ask about {s}?"),
        ),
        "cleaning": (
            "window",
            (
                "{s} is cleaned {o}.",
                "Cleaners do {s} {o}.",
                "cleaning of {s}: {o}",
                "The contractor cleans {s} {o}.",
            ),
            "cleaning",
            ("When is {s} cleaned?", "What is the cleaning schedule of {s}?"),
        ),
        "codeword": (
            "codeword",
            (
                "The door code word for {s} is {o}.",
                "{s} opens with the code word {o}.",
                "code word for {s} = {o}",
                "Say {o} at the desk to get into {s}.",
            ),
            "code word",
            ("What is the code word for {s}?", "Which code word opens {s}?"),
        ),
    },
    "never": (
        "Who designed {s}?",
        "What colour are the walls of {s}?",
        "When was {s} last renovated?",
    ),
    "topics": ("Building", "Access", "Cleaning", "Bookings", "Safety", "Parking"),
    "fillers": (
        "The lift on the west side is out of order until Friday.",
        "Someone left a blue umbrella at reception.",
        "The heating on the fourth floor is far too warm.",
        "Please remember to empty the fridge before the holidays.",
        "The fire drill is moved to next Tuesday.",
        "There is a leak above desk 14, we put a bucket under it.",
        "Can we get more chairs for the all-hands?",
        "The front door badge reader beeps but does not open.",
        "Parcel deliveries now go to the side entrance.",
        "The plants by the window need watering.",
    ),
}

_LAB = {
    "subjects": (
        "the confocal microscope",
        "the minus-eighty freezer",
        "the plate reader",
        "the mass spectrometer",
        "the anaerobic chamber",
        "the sequencing pipeline",
        "the cell culture hood",
        "the autoclave",
        "the shared centrifuge",
        "the cryostat",
        "the gel imager",
        "the liquid handler",
    ),
    "relations": {
        "room": (
            "room",
            (
                "{s} sits in {o}.",
                "{s} is set up in {o}.",
                "{s} -> {o}",
                "We moved {s} to {o} over the weekend.",
            ),
            "room",
            ("Where is {s}?", "Which room holds {s}?"),
        ),
        "calibration": (
            "duration",
            (
                "{s} is calibrated every {o}.",
                "Calibrate {s} every {o}.",
                "cal interval for {s}: every {o}",
                "Service calibrates {s} every {o}.",
            ),
            "calibration",
            ("How often is {s} calibrated?", "What is the calibration interval of {s}?"),
        ),
        "keeper": (
            "person",
            (
                "{o} is the keeper of {s}.",
                "{s} is looked after by {o}.",
                "book {s} through {o}",
                "{o} trains new users on {s}.",
            ),
            "keeper",
            ("Who is the keeper of {s}?", "Who looks after {s}?"),
        ),
        "host": (
            "host",
            (
                "{s} writes its data to {o}.",
                "Data from {s} lands on {o}.",
                "{s} saves to {o}",
                "The output of {s} goes to the share {o}.",
            ),
            "data share",
            ("Where does {s} write its data?", "Which share holds the data of {s}?"),
        ),
        "software": (
            "version",
            (
                "{s} runs acquisition software {o}.",
                "{s} was updated to {o}.",
                "{s} on {o} now",
                "The software on {s} is {o}.",
            ),
            "software",
            ("Which software version does {s} run?", "What version is {s} on?"),
        ),
    },
    "never": (
        "Who paid for {s}?",
        "What is the serial number of {s}?",
        "Which supplier services {s}?",
    ),
    "topics": ("Equipment", "Samples", "Safety", "Data", "Orders", "Training"),
    "fillers": (
        "The liquid nitrogen delivery is late this week.",
        "Whoever borrowed the good pipettes, please bring them back.",
        "Journal club is cancelled on Thursday.",
        "The fume hood alarm went off twice yesterday.",
        "We are out of 15 ml tubes, I placed an order.",
        "Please label your boxes in the cold room.",
        "The seminar speaker arrives at noon.",
        "The lab meeting moves to room 2.14 this week.",
        "Someone left the water bath on overnight.",
        "Safety training is due for everyone by the end of the month.",
    ),
}

_DOMAINS = {"helpdesk": _HELPDESK, "facilities": _FACILITIES, "lab": _LAB}
DOMAINS = tuple(_DOMAINS)

_TEAM_WORDS = (
    "Heron Falcon Otter Badger Maple Cedar Harbor Comet Anchor Lantern Willow Granite "
    "Juniper Pebble Sparrow Orchard Beacon Thistle Meadow Copper Raven Summit Marble Birch"
).split()
_CODEWORDS = (
    "lantern harbor willow pepper velvet saddle meadow quartz ribbon tundra walnut anchor "
    "cobalt thimble lagoon marble parsley violet canyon biscuit tulip ember pebble garnet"
).split()
_FIRST = (
    "Priya Dana Sam Tomasz Aiko Bruno Leila Mateo Ines Oskar Hana Ravi Nadia Elif Jonas "
    "Wanjiru Chloe Arjun Marta Kofi"
).split()
_DAYS = ("Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays")
_AUTHORS = ("dana", "sam", "priya", "tomasz", "aiko", "bruno", "leila", "mateo")
_GREETINGS = ("Hi team,", "Hello all,", "Hi,", "Morning folks,", "Dear colleagues,")
_SIGNOFFS = ("Thanks,", "Best regards,", "Cheers,", "Kind regards,", "Thank you,")
_TYPO_MIN = 5  # only words this long get a typo (values are never touched)
# The generated value kinds: each draws one candidate from the world's rng (`_Values` redraws
# until it is unique).
_FORMATS: dict[str, Callable[[np.random.Generator], str]] = {
    "ip": lambda r: f"10.{r.integers(10, 250)}.{r.integers(0, 250)}.{r.integers(2, 250)}",
    "window": lambda r: (
        f"{r.choice(_DAYS)} {int(r.integers(0, 6)):02d}:00-{int(r.integers(6, 10)):02d}:00 UTC"
    ),
    "version": lambda r: f"v{r.integers(2, 15)}.{r.integers(0, 30)}.{r.integers(0, 12)}",
    "duration": lambda r: f"{r.integers(7, 400)} {r.choice(['days', 'weeks', 'months'])}",
    "people": lambda r: f"{r.integers(3, 160)} people",
    "room": lambda r: f"room {r.integers(1, 9)}.{r.integers(1, 40):02d}",
    "host": lambda r: (
        f"\\\\fs{r.integers(1, 40):02d}\\{r.choice(['raw', 'data', 'scans'])}{r.integers(1, 99)}"
    ),
}


def natural_answer_is_right(answer_text: str, expected: str) -> bool:
    """Whether `answer_text` states `expected` whole (case-insensitive, dashes and spaces
    normalised, at word boundaries): "45" is not "45 days", "10.40" is not "10.40.2.17"."""
    if not expected:
        return False

    def norm(text: str) -> str:
        text = text.lower().replace("\u2013", "-").replace("\u2014", "-")
        return re.sub(r"\s+", " ", text).strip()

    pattern = r"(?<![\w.:])" + re.escape(norm(expected)) + r"(?![\w:]|\.\w)"
    return re.search(pattern, norm(answer_text)) is not None


class _Values:
    """Unique values of each kind, drawn from `rng`."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.used = rng, set()
        self.pools = {
            "team": [f"Team {w}" for w in _TEAM_WORDS],
            "codeword": list(_CODEWORDS),
        }
        for pool in self.pools.values():
            rng.shuffle(pool)

    def _unique(self, make) -> str:
        for _ in range(10_000):
            value = make()
            if value.lower() not in self.used:
                self.used.add(value.lower())
                return value
        raise RuntimeError("ran out of unique values")

    def surname(self) -> str:
        return fact_world.invented(self.rng, 3, ("", "l", "n", "r", "s")).capitalize()

    def value(self, kind: str) -> str:
        r = self.rng
        if kind in self.pools:
            if not self.pools[kind]:
                raise RuntimeError(f"ran out of {kind} values")
            return self._unique(lambda: self.pools[kind].pop())
        if kind in _FORMATS:
            return self._unique(lambda: _FORMATS[kind](r))
        if kind == "person":
            return self._unique(lambda: f"{r.choice(_FIRST)} {self.surname()}")
        raise ValueError(kind)


def _typos(text: str, rng: np.random.Generator, protected: Sequence[str], rate: float) -> str:
    """Swaps two letters inside a few long ordinary words (never inside `protected`)."""
    keep = [m.span() for p in protected if p for m in re.finditer(re.escape(p), text, re.I)]

    def swap(match: re.Match) -> str:
        word = match.group(0)
        inside = any(a <= match.start() < b for a, b in keep)
        if inside or rng.random() >= rate:
            return word
        i = int(rng.integers(1, len(word) - 2))
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]

    return re.sub(rf"[a-z]{{{_TYPO_MIN},}}", swap, text)


def _stamp(rng: np.random.Generator) -> str:
    return (
        f"2026-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d} "
        f"{int(rng.integers(7, 20)):02d}:{int(rng.integers(0, 60)):02d}"
    )


def _sentence(template: str, fact: Fact) -> str:
    text = template.format(s=fact.subject, o=fact.value)
    return text[0].upper() + text[1:] if text[0].islower() and template[0] == "{" else text


def _document(facts: list[Fact], spec: dict, rng: np.random.Generator, typo_rate: float) -> str:
    """One document stating `facts` (one to three, of one subject) in a random style."""
    relations = spec["relations"]
    fillers = spec["fillers"]
    style = int(rng.integers(5))
    if style == 4 or len(facts) > 2:  # a checklist: one line per fact
        lines = [f"Handover notes for {facts[0].subject} ({_stamp(rng)}):"]
        lines += [f"- {relations[f.relation][2]}: {f.value}" for f in facts]
        lines.append(f"- open tickets: {int(rng.integers(0, 9))}")
        text = "\n".join(lines)
        return _typos(text, rng, [f.value for f in facts] + [facts[0].subject], typo_rate)
    said = []
    for fact in facts:
        phrasings = relations[fact.relation][1]
        said.append(_sentence(phrasings[int(rng.integers(len(phrasings)))], fact))
    if len(said) == 2:  # two facts in one sentence
        second = said[1][0].lower() + said[1][1:] if not said[1].startswith("Team") else said[1]
        said = [said[0].rstrip(".") + ", and " + second]
    fact_text = " ".join(s if s.endswith((".", "!", "?")) else s + "." for s in said)
    context = [fillers[int(i)] for i in rng.choice(len(fillers), 3, replace=False)]
    author = _AUTHORS[int(rng.integers(len(_AUTHORS)))]
    if style == 0:  # a formal ticket with its header
        head = (
            f"Ticket #{int(rng.integers(10000, 99999))}\nSubject: "
            f"{context[0].split(',')[0].rstrip('.')}\nPriority: P{int(rng.integers(1, 5))}\n"
            f"Category: {spec['topics'][int(rng.integers(len(spec['topics'])))]}\n"
            f"Opened: {_stamp(rng)}\n\n"
        )
        body = f"{_GREETINGS[int(rng.integers(5))]}\n{context[0]} {fact_text}\n"
        text = head + body + f"{_SIGNOFFS[int(rng.integers(5))]}\n{author.capitalize()}"
    elif style == 1:  # a terse dated note
        text = f"note {_stamp(rng)[:10]}: {fact_text}"
    elif style == 2:  # a chat excerpt
        other = _AUTHORS[(int(rng.integers(1, len(_AUTHORS))) + _AUTHORS.index(author)) % 8]
        t = int(rng.integers(8, 18))
        text = (
            f"[{t:02d}:41] {other}: anyone know about {facts[0].subject}?\n"
            f"[{t:02d}:42] {author}: {fact_text}\n[{t:02d}:43] {other}: thx"
        )
    else:  # an e-mail, the fact buried among unrelated sentences
        more = [fillers[int(i)] for i in rng.choice(len(fillers), 4, replace=False)]
        paragraph = " ".join(more[:2] + [fact_text] + more[2:])
        text = (
            f"From: {author}@example.org\nDate: {_stamp(rng)}\nSubject: Re: "
            f"{spec['topics'][int(rng.integers(len(spec['topics'])))]} update\n\n"
            f"{_GREETINGS[int(rng.integers(5))]}\n\n{paragraph}\n\n"
            f"{_SIGNOFFS[int(rng.integers(5))]}\n{author.capitalize()}"
        )
    return _typos(text, rng, [f.value for f in facts] + [facts[0].subject], typo_rate)


def make_natural_world(
    domain: str,
    *,
    facts_per_level: int = 5,
    levels: Sequence[int] = SUPPORT_LEVELS,
    filler_share: float = 0.2,
    typo_rate: float = 0.03,
    seed: int = 0,
) -> FactWorld:
    """A natural-text world of `domain` (see the module docstring).

    Each subject holds one fact of each relation; facts get the support levels in a shuffled
    order. A fact's statements are spread over documents; a third of the documents that
    state a fact also state one or two other facts of the same subject (in one sentence or a
    checklist), so a fact's support counts documents, not statements. Questions: one per
    fact (a support-1 fact's answer is in no release) and one per subject of a relation the
    collection never states (answer "", support 0).

    Raises:
      ValueError: an unknown domain, or sizes that make no fact.
    """
    spec = fact_world.domain_spec(_DOMAINS, domain, facts_per_level, levels)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 100 + DOMAINS.index(domain)]))
    values = _Values(rng)
    supports = [s for s in levels for _ in range(facts_per_level)]
    rng.shuffle(supports)
    subjects = list(spec["subjects"])
    rng.shuffle(subjects)
    if -(-len(supports) // len(spec["relations"])) > len(subjects):
        raise ValueError(f"{domain} has {len(subjects)} subjects: use fewer facts per level")
    facts = fact_world.draw_facts(spec, supports, subjects.__getitem__, values.value)
    # statements left per fact; a document takes one fact, sometimes two or three of one
    # subject that still need statements (never a second statement of the same fact)
    left = {i: f.support for i, f in enumerate(facts)}
    documents = []
    while any(left.values()):
        open_ = [i for i, n in left.items() if n > 0]
        first = open_[int(rng.integers(len(open_)))]
        group = [first]
        mates = [i for i in open_ if i != first and facts[i].subject == facts[first].subject]
        if mates and rng.random() < 0.33 and facts[first].support > 1:
            extra = 1 + int(rng.random() < 0.3)
            picked = rng.choice(len(mates), min(extra, len(mates)), replace=False)
            group += [mates[int(j)] for j in picked if facts[mates[int(j)]].support > 1]
        for i in group:
            left[i] -= 1
        documents.append(_document([facts[i] for i in group], spec, rng, typo_rate))
    fillers = int(round(filler_share * len(documents) / (1 - filler_share)))
    for _ in range(fillers):
        picked = rng.choice(len(spec["fillers"]), 2, replace=False)
        author = _AUTHORS[int(rng.integers(len(_AUTHORS)))]
        body = " ".join(spec["fillers"][int(j)] for j in picked)
        documents.append(
            _typos(f"note {_stamp(rng)[:10]} from {author}: {body}", rng, [], typo_rate)
        )
    documents = [documents[int(i)] for i in rng.permutation(len(documents))]
    questions = fact_world.ask(facts, spec, rng, domain)
    for subject in dict.fromkeys(f.subject for f in facts):
        template = spec["never"][int(rng.integers(len(spec["never"])))]
        questions.append(FactQuestion(template.format(s=subject), "", "never", 0, domain))
    return FactWorld(domain, facts, documents, questions)

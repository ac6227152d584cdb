"""Fact worlds: private collections of invented entities, each fact stated a known number of times.

A world is one domain (`DOMAINS`: people, products, species) of invented entities, each with
three typed facts ("Dara Quillon works at Velmora Dynamics", "... was born in 1987").
Every fact is stated in `SUPPORT_LEVELS` documents (1, 3, 5, 10, 20 or 50), each time in one
of several phrasings chosen at random, subject first or object first, sometimes beside a
filler sentence; filler documents state no fact. A question asks one fact; its answer is the
fact's value, unique in the world, so that "a fact stated in one document appears in the
release" can be checked by string search. Names are invented syllables, so no pretrained LM
knows them: an answer can only come from the collection.

People is the validation domain (every default of `synthgen.knowledge.facts` is chosen on it);
products and species are the test domains, reported and never tuned on.
``python -m dpsynth.evaluation.fact_world --domain people --out DIR`` writes ``corpus.jsonl`` and
``questions.jsonl``; draws come from ``SeedSequence((seed, domain))``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

SUPPORT_LEVELS = (1, 3, 5, 10, 20, 50)
VALIDATION_DOMAIN = "people"
TEST_DOMAINS = ("products", "species")

_ONSETS = "b br d dr f g k l m n p r s st t tr v z".split()
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "l", "n", "r", "s")

# Each relation: the object's kind, phrasings (s: subject, o: object) and questions.
_DOMAINS: dict[str, dict] = {
    "people": {
        "entity": "person",
        "relations": {
            "employer": (
                "company",
                (
                    "{s} works at {o}.",
                    "{o} employs {s} as an engineer.",
                    "{s} has been with {o} for several years.",
                    "At {o}, {s} leads a small team.",
                    "{s} took a job at {o} last spring.",
                ),
                ("Which company does {s} work for?", "Where is {s} employed?"),
            ),
            "hometown": (
                "town",
                (
                    "{s} grew up in {o}.",
                    "{s} was raised in the town of {o}.",
                    "{o} is where {s} spent their childhood.",
                    "Born and raised in {o}, {s} still visits often.",
                    "{s} comes from {o}.",
                ),
                ("In which town did {s} grow up?", "What is the hometown of {s}?"),
            ),
            "born": (
                "year",
                (
                    "{s} was born in {o}.",
                    "In {o}, {s} was born.",
                    "{s}, born in {o}, is a keen cyclist.",
                    "The year {s} was born was {o}.",
                ),
                ("In which year was {s} born?", "What year was {s} born in?"),
            ),
        },
    },
    "products": {
        "entity": "product",
        "relations": {
            "maker": (
                "company",
                (
                    "The {s} is made by {o}.",
                    "{o} manufactures the {s}.",
                    "{o} released the {s} to good reviews.",
                    "Built by {o}, the {s} sells well.",
                    "The {s} comes from the workshops of {o}.",
                ),
                ("Which company makes the {s}?", "Who manufactures the {s}?"),
            ),
            "price": (
                "price",
                (
                    "The {s} costs {o}.",
                    "The {s} sells for {o}.",
                    "At {o}, the {s} is good value.",
                    "You can buy the {s} for {o}.",
                ),
                ("How much does the {s} cost?", "What is the price of the {s}?"),
            ),
            "factory": (
                "town",
                (
                    "The {s} is assembled in {o}.",
                    "Every {s} is built in a factory in {o}.",
                    "The factory in {o} produces the {s}.",
                    "The {s} is put together in the town of {o}.",
                ),
                ("In which town is the {s} assembled?", "Where is the {s} built?"),
            ),
        },
    },
    "species": {
        "entity": "species",
        "relations": {
            "habitat": (
                "region",
                (
                    "The {s} lives in the {o}.",
                    "The {o} are home to the {s}.",
                    "Field teams found the {s} across the {o}.",
                    "The {s} is found only in the {o}.",
                    "In the {o}, the {s} is common.",
                ),
                ("Where does the {s} live?", "What is the habitat of the {s}?"),
            ),
            "discoverer": (
                "person",
                (
                    "The {s} was first described by {o}.",
                    "{o} discovered the {s}.",
                    "The naturalist {o} identified the {s}.",
                    "{o} was the first to record the {s}.",
                ),
                ("Who discovered the {s}?", "Who first described the {s}?"),
            ),
            "length": (
                "length",
                (
                    "The {s} grows to about {o}.",
                    "An adult {s} measures {o}.",
                    "At {o}, the {s} is easy to spot.",
                    "The {s} reaches a length of {o}.",
                ),
                ("How long is the {s}?", "What length does the {s} grow to?"),
            ),
        },
    },
}
DOMAINS = tuple(_DOMAINS)

_FILLERS = (
    "The weather was mild for most of the season.",
    "A new road opened near the old market last week.",
    "Local volunteers cleaned the park on Saturday morning.",
    "The library extended its opening hours over the winter.",
    "Prices at the farmers market rose slightly this year.",
    "The committee will meet again after the holidays.",
    "Heavy rain delayed several trains in the evening.",
    "The museum added a room of old maps and letters.",
    "A small bakery on the corner now sells fresh bread daily.",
    "Most visitors arrive in the summer months.",
)
_COMPANY_ENDINGS = ("Dynamics", "Labs", "Systems", "Works", "Industries", "Partners")
_TOWN_ENDINGS = ("wick", "ford", "ton", "ham", "by", "stead")
_REGION_ENDINGS = ("Marshes", "Highlands", "Wetlands", "Uplands", "Lowlands")


@dataclasses.dataclass(frozen=True)
class Fact:
    """One fact: subject, relation, value, and in how many documents it is stated."""

    subject: str
    relation: str
    value: str
    support: int


@dataclasses.dataclass(frozen=True)
class FactQuestion:
    """A question about one fact; `answer` is the value an answer must contain."""

    question: str
    answer: str
    relation: str
    support: int
    domain: str


def answer_is_right(answer_text: str, expected: str) -> bool:
    """Whether `answer_text` states `expected` (case-insensitive, at word boundaries; a
    length or price is right when its number is)."""
    core = re.sub(r"[^0-9]", "", expected) if re.search(r"\d", expected) else expected
    pattern = r"(?<![\w])" + re.escape(core.lower()) + r"(?![\w])"
    text = answer_text.lower().replace(",", "") if core.isdigit() else answer_text.lower()
    return re.search(pattern, text) is not None


def invented(rng: np.random.Generator, syllables: int, codas: Sequence[str] = _CODAS) -> str:
    """`syllables` random onset-vowel-coda syllables, joined (lower case)."""
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(codas) for _ in range(syllables)
    )


class _Names:
    """Unique invented words from syllables (never an English word of wordfreq's top list)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.used = rng, set()

    def word(self, syllables: int = 2, ending: str = "") -> str:
        for _ in range(1000):
            word = (invented(self.rng, syllables) + ending).capitalize()
            if word.lower() not in self.used:
                self.used.add(word.lower())
                return word
        raise RuntimeError("ran out of invented words")

    def value(self, kind: str, numbers: set[int]) -> str:
        def unique(low: int, high: int) -> int:
            while True:
                n = int(self.rng.integers(low, high))
                if n not in numbers:
                    numbers.add(n)
                    return n

        if kind == "company":
            return f"{self.word()} {self.rng.choice(_COMPANY_ENDINGS)}"
        if kind == "town":
            return self.word(1, str(self.rng.choice(_TOWN_ENDINGS)))
        if kind == "region":
            return f"{self.word()} {self.rng.choice(_REGION_ENDINGS)}"
        if kind in ("person",):
            return f"{self.word()} {self.word()}"
        if kind == "year":
            return str(unique(1931, 2006))
        if kind == "price":
            return f"${unique(12, 990)}"
        if kind == "length":
            return f"{unique(11, 240)} cm"
        raise ValueError(kind)

    def entity(self, kind: str) -> str:
        if kind == "person":
            return f"{self.word()} {self.word()}"
        if kind == "product":
            letter = "ABCDEFGHKMNPRSTVXZ"[int(self.rng.integers(18))]
            return f"{self.word()} {letter}{int(self.rng.integers(2, 10))}"
        return f"{self.word()} {self.word(2).lower()}"  # species: "Velarus torrin"


@dataclasses.dataclass(frozen=True)
class FactWorld:
    """One domain's facts, documents and questions."""

    domain: str
    facts: list[Fact]
    documents: list[str]
    questions: list[FactQuestion]


def domain_spec(domains: dict, domain: str, facts_per_level: int, levels: Sequence[int]) -> dict:
    """`domains[domain]`, after refusing an unknown domain or sizes that make no fact."""
    if domain not in domains:
        raise ValueError(f"domain must be one of {tuple(domains)}, got {domain!r}")
    if facts_per_level < 1 or not levels or min(levels) < 1:
        raise ValueError(f"need facts_per_level >= 1 and levels >= 1: {facts_per_level=}")
    return domains[domain]


def draw_facts(
    spec: dict, supports: Sequence[int], subject: Callable[[int], str], value: Callable[[str], str]
) -> list[Fact]:
    """One fact per entry of `supports`: subject e (``subject(e)``, drawn first) holds one
    fact of each of `spec`'s relations in turn, its value ``value(kind)``."""
    relations = list(spec["relations"].items())
    facts = []
    for e in range(-(-len(supports) // len(relations))):
        name = subject(e)
        for r, (relation, (kind, *_)) in enumerate(relations):
            i = e * len(relations) + r
            if i < len(supports):
                facts.append(Fact(name, relation, value(kind), supports[i]))
    return facts


def ask(facts: Sequence[Fact], spec: dict, rng: np.random.Generator, domain: str) -> list:
    """One `FactQuestion` per fact, in one of its relation's question templates (the
    relation's last item), drawn from `rng`."""
    questions = []
    for fact in facts:
        templates = spec["relations"][fact.relation][-1]
        text = templates[int(rng.integers(len(templates)))].format(s=fact.subject)
        questions.append(FactQuestion(text, fact.value, fact.relation, fact.support, domain))
    return questions


def make_world(
    domain: str,
    *,
    facts_per_level: int = 5,
    levels: Sequence[int] = SUPPORT_LEVELS,
    filler_share: float = 0.15,
    seed: int = 0,
) -> FactWorld:
    """A world of `domain`: ``facts_per_level`` facts at each support level, each entity
    holding one fact of each relation (levels shuffled across entities).

    Raises:
      ValueError: an unknown domain, or sizes that make no fact.
    """
    spec = domain_spec(_DOMAINS, domain, facts_per_level, levels)
    rng = np.random.default_rng(np.random.SeedSequence([seed, DOMAINS.index(domain)]))
    names, numbers = _Names(rng), set()
    supports = [s for s in levels for _ in range(facts_per_level)]
    rng.shuffle(supports)
    facts = draw_facts(
        spec, supports, lambda e: names.entity(spec["entity"]), lambda k: names.value(k, numbers)
    )
    documents = []
    for fact in facts:
        phrasings = spec["relations"][fact.relation][1]
        for _ in range(fact.support):
            text = phrasings[int(rng.integers(len(phrasings)))].format(s=fact.subject, o=fact.value)
            text = text[0].upper() + text[1:]
            if rng.random() < 0.5:
                filler = _FILLERS[int(rng.integers(len(_FILLERS)))]
                text = f"{text} {filler}" if rng.random() < 0.5 else f"{filler} {text}"
            documents.append(text)
    fillers = int(round(filler_share * len(documents) / (1 - filler_share)))
    for _ in range(fillers):
        pair = rng.choice(len(_FILLERS), size=2, replace=False)
        documents.append(" ".join(_FILLERS[int(j)] for j in pair))
    documents = [documents[int(i)] for i in rng.permutation(len(documents))]
    return FactWorld(domain, facts, documents, ask(facts, spec, rng, domain))


def write_jsonl(rows: Iterable[dict], path: str | Path) -> None:
    """Writes `rows` as JSON lines (UTF-8), making the folder if needed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_world(world: FactWorld, out: str | Path) -> dict:
    """Writes ``corpus.jsonl`` (doc_id, text) and ``questions.jsonl``; returns counts."""
    ids = (f"{world.domain}-{i:05d}" for i in range(len(world.documents)))
    corpus = ({"doc_id": i, "text": text} for i, text in zip(ids, world.documents))
    write_jsonl(corpus, Path(out) / "corpus.jsonl")
    write_jsonl(map(dataclasses.asdict, world.questions), Path(out) / "questions.jsonl")
    return {
        "domain": world.domain,
        "documents": len(world.documents),
        "facts": len(world.facts),
        "questions": len(world.questions),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", choices=DOMAINS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--facts-per-level", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    world = make_world(args.domain, facts_per_level=args.facts_per_level, seed=args.seed)
    print(json.dumps(write_world(world, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

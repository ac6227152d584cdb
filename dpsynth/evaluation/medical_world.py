"""Fictional medical records: a private collection whose facts no pretrained LM can know.

Diseases, symptoms and treatments are invented words, so "Which disease causes tadrunic
numbness and gugolal spots?" can only be answered from retrieved records. Disease frequencies
follow a Dirichlet draw: some diseases fill dozens of records (easy for DP aggregation), some
one to three (hard), so accuracy can be read against a question's ``support``. Every invented
word of a world is unique, and each disease's first two symptoms are used by no other disease.
Draws come from ``SeedSequence(config.seed)``: same config, same world.

References:
  Grislain, 2024: sarus-tech/medical_dirichlet_phi3 (fictional diseases to evaluate DP-RAG).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpsynth.evaluation.fact_world import write_jsonl

# The rule that scores a world's answers, re-exported here for the evaluations that use it.
from retriever.answer_match import answer_is_correct as answer_is_correct

# Plain consonant-vowel syllables: with SmolLM2's BPE (vocab 49152), 95% of disease names are
# 2-4 tokens and the rest 5 (measured over 4,000 names).
_ONSETS = "b br d dr f fl g gr k l m n p pl qu r s st t tr v z".split()
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "l", "n", "r", "s", "x")
_DISEASE_ENDINGS = ("itis", "osis", "emia", "ax", "ora")  # one-word names: "Sefonemia"
_DISEASE_QUALIFIERS = ("fever", "pox", "syndrome", "palsy", "blight")  # "Besox fever"
_ADJ_ENDINGS = ("ic", "ous", "ish", "al", "ent")
_SYMPTOM_NOUNS = (
    "rash cough tremor itch spots blisters swelling numbness twitching ache wheeze chills "
    "flushing cramps drowsiness hiccups".split()
)
_DRUG_ENDINGS = ("ozane", "ivir", "amab", "oline", "afen", "orex")
_FIRST_NAMES = "Erika Tomas Amina Lars Priya Jonah Mei Carlos Ines Kofi Sanna Hana Rosa".split()
_LAST_NAMES = "Jensen Okafor Varga Moreau Tanaka Silva Novak Haddad Osei Petrov Duarte Holm".split()
# Every word the pools can spell that is in the all-MiniLM-L6-v2 WordPiece vocabulary or the
# wiki-summaries corpus (found by enumerating them all), plus common disease words.
_REAL_WORDS = frozenset(
    "botanic demonic dominic fabulous federal funeral general generic generous lateral liberal "
    "literal luminous masonic mineral natural nominal numerous pastoral populous refusal rigorous "
    "seminal several titanic tribunal vigorous defend demand depend felix legend leland ligand "
    "linux matrix poland reflex relax remind remix roland gasoline flu cold cancer diabetes fever "
    "measles mumps asthma gout lupus polio rabies malaria anemia sepsis ulcer colitis".split()
)
# p: patient, a: age, s: symptoms, d: disease, t: treatment.
_RECORD_TEMPLATES = (
    "Patient {p}, {a}, presented with {s}. Diagnosis: {d}. Treated with {t}.",
    "{p} ({a}) reported {s} and was diagnosed with {d}; {t} was prescribed.",
    "A {a}-year-old patient, {p}, came in with {s}. The diagnosis was {d}, treated with {t}.",
)
_QUESTION_TEMPLATES = (
    "Which disease causes {a} and {b}?",
    "A patient presents with {a} and {b}. Which disease is it?",
    "What is the diagnosis for a patient with {a} and {b}?",
)


@dataclasses.dataclass(frozen=True)
class MedicalWorldConfig:
    """Size and seed of a fictional medical world."""

    num_diseases: int = 20
    symptoms_per_disease: int = 4  # the first two are distinctive (used by no other disease)
    symptom_pool: int = 60  # distinct symptoms: 2 * num_diseases distinctive, the rest shared
    num_records: int = 400  # each disease gets at least one
    dirichlet_alpha: float = 0.5  # symmetric Dirichlet over disease frequencies; small: skewed
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_diseases < 1:
            raise ValueError(f"need at least one disease, num_diseases={self.num_diseases}")
        if self.symptoms_per_disease < 2:
            raise ValueError(
                f"need two distinctive symptoms, symptoms_per_disease={self.symptoms_per_disease}"
            )
        if self.symptom_pool < 2 * self.num_diseases + self.symptoms_per_disease - 2:
            raise ValueError(
                f"symptom_pool too small for the diseases, symptom_pool={self.symptom_pool}"
            )
        if self.num_records < self.num_diseases:
            raise ValueError(f"need a record per disease, num_records={self.num_records}")
        if not (math.isfinite(self.dirichlet_alpha) and self.dirichlet_alpha > 0):
            raise ValueError(
                f"dirichlet_alpha must be positive, dirichlet_alpha={self.dirichlet_alpha}"
            )


@dataclasses.dataclass(frozen=True)
class Disease:
    """An invented disease: its name, symptoms (the first two distinctive) and treatment."""

    name: str
    symptoms: tuple[str, ...]
    treatment: str


@dataclasses.dataclass(frozen=True)
class Record:
    """One patient record of the private collection; ``disease`` is the disease name."""

    doc_id: str
    text: str
    disease: str


@dataclasses.dataclass(frozen=True)
class Question:
    """A question, its expected answer, the disease asked about and its record count."""

    question: str
    answer: str
    disease: str
    support: int


@dataclasses.dataclass(frozen=True)
class MedicalWorld:
    """The diseases and the records of one fictional world."""

    config: MedicalWorldConfig
    diseases: list[Disease]
    records: list[Record]

    @property
    def support(self) -> dict[str, int]:
        """Number of records of each disease, by name (every disease has at least one)."""
        counts = Counter(r.disease for r in self.records)
        return {d.name: counts[d.name] for d in self.diseases}

    def questions(self, per_disease: int = 1, seed: int = 0) -> list[Question]:
        """Questions naming a disease's two distinctive symptoms; the answer is its name.

        Args:
          per_disease: questions per disease, 1 to 6: "Which disease causes <a> and <b>?" first,
            then other phrasings and the other symptom order.
          seed: seed of the symptom order.
        """
        if not 1 <= per_disease <= 2 * len(_QUESTION_TEMPLATES):
            raise ValueError(f"per_disease must be in [1, 6], {per_disease=}")
        rng, support, out = np.random.default_rng(seed), self.support, []
        for disease in self.diseases:
            flip, (a, b) = int(rng.integers(2)), disease.symptoms[:2]
            for j in range(per_disease):
                x, y = (a, b) if (flip + j // len(_QUESTION_TEMPLATES)) % 2 == 0 else (b, a)
                text = _QUESTION_TEMPLATES[j % len(_QUESTION_TEMPLATES)].format(a=x, b=y)
                out.append(Question(text, disease.name, disease.name, support[disease.name]))
        return out


def _new_word(
    rng: np.random.Generator, used: set[str], ends: Sequence[str] = ("",), codas=_CODAS, most=12
) -> str:
    """A word not in ``used`` (then added): two onset-vowel syllables, a coda and an ending."""

    def pick(pool: Sequence[str]) -> str:
        return pool[int(rng.integers(len(pool)))]

    for _ in range(10_000):
        stem = pick(_ONSETS) + pick(_VOWELS) + pick(_ONSETS) + pick(_VOWELS) + pick(codas)
        ending = pick(ends)
        if ending[:1] in tuple("aeiou") and stem[-1] in "aeiou":
            stem += pick("lnrx")
        word = stem + ending
        ok = 5 <= len(word) <= most and not re.search(r"(.)\1\1|uu|ii|quo?u", word)
        if ok and word not in used and word not in _REAL_WORDS:
            used.add(word)
            return word
    raise RuntimeError("syllable pools exhausted; use fewer diseases or symptoms")


def _make_diseases(config: MedicalWorldConfig, rng: np.random.Generator) -> list[Disease]:
    used = set(_DISEASE_QUALIFIERS) | set(_SYMPTOM_NOUNS)
    names = []
    for _ in range(config.num_diseases):
        if rng.random() < 0.5:
            names.append(_new_word(rng, used, _DISEASE_ENDINGS, most=10).capitalize())
        else:
            stem = _new_word(rng, used, codas=("x", "nd"), most=8).capitalize()
            names.append(f"{stem} {rng.choice(_DISEASE_QUALIFIERS)}")
    nouns = rng.permutation(len(_SYMPTOM_NOUNS))
    symptoms = [
        f"{_new_word(rng, used, _ADJ_ENDINGS)} {_SYMPTOM_NOUNS[nouns[i % len(nouns)]]}"
        for i in range(config.symptom_pool)
    ]
    distinctive, shared = symptoms[: 2 * config.num_diseases], symptoms[2 * config.num_diseases :]
    diseases = []
    for i, name in enumerate(names):
        extra = rng.choice(len(shared), config.symptoms_per_disease - 2, replace=False)
        own = (distinctive[2 * i], distinctive[2 * i + 1], *(shared[j] for j in extra))
        treatment = _new_word(rng, used, _DRUG_ENDINGS).capitalize()
        diseases.append(Disease(name, own, treatment))
    return diseases


def make_world(config: MedicalWorldConfig) -> MedicalWorld:
    """Builds the diseases and the shuffled records ``rec-00000``, ... of a world.

    Each disease gets one record plus a multinomial share of the rest, with frequencies drawn
    from a symmetric Dirichlet. A record lists two or three of its disease's symptoms, at least
    one of them distinctive, then the diagnosis and the treatment.
    """
    names_seq, freq_seq, record_seq = np.random.SeedSequence(config.seed).spawn(3)
    diseases = _make_diseases(config, np.random.default_rng(names_seq))
    freq_rng = np.random.default_rng(freq_seq)
    probs = freq_rng.dirichlet(np.full(config.num_diseases, config.dirichlet_alpha))
    counts = 1 + freq_rng.multinomial(config.num_records - config.num_diseases, probs)
    rng = np.random.default_rng(record_seq)
    order = rng.permutation(np.repeat(np.arange(config.num_diseases), counts))
    records = []
    for i, d in enumerate(order):
        disease = diseases[int(d)]
        n = len(disease.symptoms)
        k = int(rng.integers(2, min(3, n) + 1))
        first = int(rng.integers(2))
        others = rng.choice([j for j in range(n) if j != first], k - 1, replace=False)
        picked = [disease.symptoms[j] for j in rng.permutation([first, *others])]
        patient = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}"
        template = _RECORD_TEMPLATES[int(rng.integers(len(_RECORD_TEMPLATES)))]
        age = int(rng.integers(18, 91))
        symptoms = f"{', '.join(picked[:-1])} and {picked[-1]}"
        text = template.format(p=patient, a=age, s=symptoms, d=disease.name, t=disease.treatment)
        records.append(Record(f"rec-{i:05d}", text, disease.name))
    return MedicalWorld(config, diseases, records)


def sized_world(num_diseases: int, num_records: int, seed: int) -> MedicalWorld:
    """The world of these sizes, its symptom pool grown to 3 symptoms per disease."""
    pool = max(MedicalWorldConfig.symptom_pool, 3 * num_diseases)
    return make_world(MedicalWorldConfig(num_diseases, 4, pool, num_records, seed=seed))


def write_corpus(world: MedicalWorld, path: str | Path) -> None:
    """Writes the records as corpus.jsonl rows ``{"doc_id", "text"}`` (see `read_corpus`)."""
    write_jsonl(({"doc_id": r.doc_id, "text": r.text} for r in world.records), path)


def write_questions(questions: Sequence[Question], path: str | Path) -> None:
    """Writes questions.jsonl rows ``{"question", "answer", "disease", "support"}``."""
    write_jsonl((dataclasses.asdict(q) for q in questions), path)


def support_histogram(world: MedicalWorld) -> dict[str, int]:
    """Diseases per support bin: "1", "2-3", "4-7", "8-15", ... (powers of two)."""
    bins: Counter[int] = Counter(int(s).bit_length() - 1 for s in world.support.values())
    return {(f"{1 << b}" if b == 0 else f"{1 << b}-{(2 << b) - 1}"): bins[b] for b in sorted(bins)}


def write_world(
    out: str | Path,
    num_records: int = MedicalWorldConfig.num_records,
    num_diseases: int = MedicalWorldConfig.num_diseases,
    per_disease: int = 1,
    seed: int = MedicalWorldConfig.seed,
) -> dict:
    """Writes ``out/corpus.jsonl`` (the private collection) and ``out/questions.jsonl``.

    Returns:
      The world's public summary: counts and the support histogram (no record text).

    Raises:
      ValueError: sizes that cannot make a world (see `MedicalWorldConfig`).
    """
    world = sized_world(num_diseases, num_records, seed)
    questions = world.questions(per_disease=per_disease, seed=seed)
    write_corpus(world, Path(out) / "corpus.jsonl")
    write_questions(questions, Path(out) / "questions.jsonl")
    summary = {"num_diseases": len(world.diseases), "num_records": len(world.records)}
    return summary | {
        "num_questions": len(questions),
        "support_histogram": support_histogram(world),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpsynth.evaluation.medical_world --out DIR`` (``retriever data medical``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--num-records", type=int, default=MedicalWorldConfig.num_records)
    parser.add_argument("--num-diseases", type=int, default=MedicalWorldConfig.num_diseases)
    parser.add_argument("--per-disease", type=int, default=1, help="questions per disease")
    parser.add_argument("--seed", type=int, default=MedicalWorldConfig.seed)
    args = parser.parse_args(argv)
    try:
        summary = write_world(
            args.out, args.num_records, args.num_diseases, args.per_disease, args.seed
        )
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

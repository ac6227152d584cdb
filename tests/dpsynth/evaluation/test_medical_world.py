"""Tests for the fictional medical world used to evaluate DP-RAG."""

from __future__ import annotations

import collections
import dataclasses
import json
import re

import pytest

from dpsynth.evaluation import medical_world
from dpsynth.evaluation.medical_world import MedicalWorldConfig, answer_is_correct, make_world

# Real disease and symptom words an invented name must never be (alone).
REAL_WORDS = {
    "flu", "cold", "cancer", "diabetes", "fever", "measles", "asthma", "malaria", "influenza",
    "covid", "pneumonia", "tuberculosis", "rash", "cough", "stroke", "migraine", "hepatitis",
    "arthritis", "anemia", "lupus", "gout", "mumps", "polio", "aspirin", "ibuprofen", "insulin",
    "general", "natural", "matrix", "relax", "legend", "panic", "toxic", "viral", "nasal",
}  # fmt: skip


def _mentions(text: str, phrase: str) -> bool:
    return re.search(rf"\b{re.escape(phrase)}\b", text, re.IGNORECASE) is not None


@pytest.fixture(scope="module")
def world() -> medical_world.MedicalWorld:
    return make_world(MedicalWorldConfig())


def test_same_seed_same_world_other_seed_other_names(world):
    again = make_world(MedicalWorldConfig())
    assert again.diseases == world.diseases
    assert again.records == world.records
    other = make_world(MedicalWorldConfig(seed=1))
    assert {d.name for d in other.diseases}.isdisjoint({d.name for d in world.diseases})


def test_names_do_not_depend_on_num_records(world):
    bigger = make_world(MedicalWorldConfig(num_records=1000))
    assert bigger.diseases == world.diseases
    assert len(bigger.records) == 1000


def test_names_are_unique_short_and_invented(world):
    names = [d.name for d in world.diseases]
    treatments = [d.treatment for d in world.diseases]
    adjectives = sorted({s.split()[0] for d in world.diseases for s in d.symptoms})
    first_words = [n.split()[0] for n in names]
    assert len(set(names)) == len(names) == 20
    assert len(set(first_words)) == len(first_words)
    assert len(set(treatments)) == len(treatments)
    # No invented word is used twice across categories.
    assert not set(first_words) & set(treatments)
    assert not {w.lower() for w in first_words} & set(adjectives)
    for name in names:
        assert 1 <= len(name.split()) <= 2
        assert name.lower() not in REAL_WORDS
        assert len(name.split()[0]) >= 5
    for word in [*first_words, *treatments, *adjectives]:
        assert word.lower() not in REAL_WORDS
        assert word.isalpha() and re.search("[aeiou]", word.lower()), word


def test_each_disease_has_two_distinctive_symptoms(world):
    owners = collections.Counter(s for d in world.diseases for s in set(d.symptoms))
    for disease in world.diseases:
        assert len(disease.symptoms) == 4
        assert len(set(disease.symptoms)) == 4
        assert owners[disease.symptoms[0]] == owners[disease.symptoms[1]] == 1
    full_sets = {frozenset(d.symptoms) for d in world.diseases}
    assert len(full_sets) == len(world.diseases)


def test_every_record_names_exactly_one_disease_and_a_distinctive_symptom(world):
    by_name = {d.name: d for d in world.diseases}
    assert len({r.doc_id for r in world.records}) == len(world.records) == 400
    for record in world.records:
        named = [n for n in by_name if _mentions(record.text, n)]
        assert named == [record.disease], record.text
        disease = by_name[record.disease]
        assert any(s in record.text for s in disease.symptoms[:2]), record.text
        assert disease.treatment in record.text
        other_symptoms = {s for d in world.diseases if d is not disease for s in d.symptoms}
        assert not any(s in record.text for s in other_symptoms - set(disease.symptoms))


def test_support_counts_match_records(world):
    counts = collections.Counter(r.disease for r in world.records)
    assert world.support == {d.name: counts[d.name] for d in world.diseases}
    assert sum(world.support.values()) == len(world.records)
    questions = world.questions()
    assert [q.support for q in questions] == [counts[d.name] for d in world.diseases]


def test_dirichlet_frequencies_spread(world):
    support = world.support.values()
    assert min(support) >= 1
    assert max(support) >= 5 * min(support)
    assert sum(s <= 3 for s in support) >= 2  # rare facts exist
    assert sum(s >= 20 for s in support) >= 2  # and common ones


def test_smaller_alpha_is_more_skewed():
    def top_share(alpha: float) -> float:
        shares = []
        for seed in range(10):
            world = make_world(MedicalWorldConfig(dirichlet_alpha=alpha, seed=seed))
            shares.append(max(world.support.values()) / len(world.records))
        return sum(shares) / len(shares)

    assert top_share(0.1) > top_share(10.0) + 0.2


def test_questions_use_the_distinctive_symptoms(world):
    by_name = {d.name: d for d in world.diseases}
    questions = world.questions()
    assert len(questions) == len(world.diseases)
    for q in questions:
        disease = by_name[q.disease]
        assert q.answer == q.disease
        assert q.question.startswith("Which disease causes ")
        assert disease.symptoms[0] in q.question and disease.symptoms[1] in q.question
        for other in world.diseases:
            if other is not disease:
                assert not any(s in q.question for s in other.symptoms), q.question
        assert not _mentions(q.question, q.disease)


def test_questions_per_disease_are_distinct_and_deterministic(world):
    questions = world.questions(per_disease=6, seed=3)
    assert len(questions) == 6 * len(world.diseases)
    assert len({q.question for q in questions}) == len(questions)
    assert questions == world.questions(per_disease=6, seed=3)
    with pytest.raises(ValueError, match="per_disease"):
        world.questions(per_disease=7)


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_diseases": 0},
        {"symptoms_per_disease": 1},
        {"symptom_pool": 41},
        {"num_records": 19},
        {"dirichlet_alpha": 0.0},
        {"dirichlet_alpha": float("inf")},
    ],
)
def test_config_rejects_bad_values(overrides):
    with pytest.raises(ValueError):
        dataclasses.replace(MedicalWorldConfig(), **overrides)


@pytest.mark.parametrize(
    "config",
    [
        MedicalWorldConfig(num_diseases=1, symptoms_per_disease=2, symptom_pool=2, num_records=1),
        MedicalWorldConfig(num_diseases=3, symptoms_per_disease=6, symptom_pool=10, num_records=9),
        MedicalWorldConfig(num_diseases=200, symptom_pool=500, num_records=2000, seed=7),
    ],
)
def test_edge_sizes_build_valid_worlds(config):
    world = make_world(config)
    assert len(world.diseases) == config.num_diseases
    assert len(world.records) == config.num_records
    assert min(world.support.values()) >= 1
    assert len({d.name.split()[0] for d in world.diseases}) == config.num_diseases
    for record in world.records[:50]:
        disease = next(d for d in world.diseases if d.name == record.disease)
        assert any(s in record.text for s in disease.symptoms[:2])


@pytest.mark.parametrize(
    "answer, name, others, expected",
    [
        ("The disease is Quendral fever.", "Quendral fever", (), True),
        ("QUENDRAL FEVER", "Quendral fever", (), True),
        ("Probably quendral.", "Quendral fever", (), True),  # first word, >= 5 characters
        ("Quendral", "Quendral fever", ("Quendral pox",), False),  # first word not unique
        ("Quendral fever", "Quendral fever", ("Quendral pox",), True),
        ("Quendralix", "Quendral fever", (), False),  # not at a word boundary
        ("Zup", "Zup fever", (), False),  # first word too short
        ("zup fever", "Zup fever", (), True),
        ("Snurflaxitis", "Snurflaxitis", (), True),
        ("It is Gorbex pox.", "Quendral fever", (), False),
        ("fever", "Quendral fever", (), False),
        ("", "Quendral fever", (), False),
    ],
)
def test_answer_is_correct(answer, name, others, expected):
    assert answer_is_correct(answer, name, others=others) is expected


def test_answer_is_correct_on_a_world(world):
    names = [d.name for d in world.diseases]
    for name in names:
        assert answer_is_correct(f"Answer: {name}.", name, others=names)
        assert answer_is_correct(name.split()[0].upper(), name, others=names)
        wrong = next(n for n in names if n != name)
        assert not answer_is_correct(f"Answer: {wrong}.", name, others=names)


def test_writers_use_the_project_formats(world, tmp_path):
    from retriever.data import read_corpus

    medical_world.write_corpus(world, tmp_path / "corpus.jsonl")
    doc_ids, texts = read_corpus(tmp_path / "corpus.jsonl")
    assert doc_ids == [r.doc_id for r in world.records]
    assert texts == [r.text for r in world.records]
    questions = world.questions(per_disease=2)
    medical_world.write_questions(questions, tmp_path / "questions.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "questions.jsonl").read_text().splitlines()]
    assert rows == [dataclasses.asdict(q) for q in questions]
    assert set(rows[0]) == {"question", "answer", "disease", "support"}


def test_cli_writes_corpus_and_questions(tmp_path, capsys):
    out = tmp_path / "medical"
    args = ["--out", str(out), "--num-records", "60", "--num-diseases", "6", "--seed", "2"]
    assert medical_world.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_records"] == 60 and summary["num_diseases"] == 6
    assert summary["num_questions"] == 6
    assert sum(summary["support_histogram"].values()) == 6
    corpus = (out / "corpus.jsonl").read_text().splitlines()
    questions = (out / "questions.jsonl").read_text().splitlines()
    assert len(corpus) == 60 and len(questions) == 6
    assert set(json.loads(corpus[0])) == {"doc_id", "text"}
    expected = make_world(MedicalWorldConfig(num_diseases=6, num_records=60, seed=2))
    assert json.loads(corpus[0])["text"] == expected.records[0].text


def test_cli_error_is_one_line(tmp_path, capsys):
    args = ["--out", str(tmp_path), "--num-records", "3", "--num-diseases", "5"]
    assert medical_world.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "num_records" in err and "\n" not in err
    assert not (tmp_path / "corpus.jsonl").exists()


def test_support_histogram_bins():
    config = MedicalWorldConfig(num_diseases=3, symptom_pool=8, num_records=3)
    world = make_world(config)
    assert medical_world.support_histogram(world) == {"1": 3}
    world = dataclasses.replace(world, records=world.records + world.records[:1] * 4)
    assert sum(medical_world.support_histogram(world).values()) == 3
    assert "4-7" in medical_world.support_histogram(world)

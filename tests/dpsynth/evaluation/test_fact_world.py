"""Fact worlds: each fact stated in exactly its support's documents, unique values."""

from __future__ import annotations

import json

import pytest

from dpsynth.evaluation.fact_world import (
    DOMAINS,
    SUPPORT_LEVELS,
    answer_is_right,
    main,
    make_world,
)


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_fact_is_stated_in_exactly_its_support(domain):
    world = make_world(domain, facts_per_level=2)
    assert sorted(f.support for f in world.facts) == sorted(SUPPORT_LEVELS * 2)
    values = [f.value for f in world.facts]
    assert len(set(values)) == len(values)  # a value names one fact
    for fact in world.facts:
        stating = [d for d in world.documents if fact.subject in d and fact.value in d]
        assert len(stating) == fact.support
    assert any(not any(f.subject in d for f in world.facts) for d in world.documents)  # fillers
    assert [q.answer for q in world.questions] == values
    assert all(q.question and q.domain == domain for q in world.questions)


def test_same_seed_same_world_other_seed_other_names():
    assert make_world("people", seed=3) == make_world("people", seed=3)
    assert make_world("people", seed=3).facts[0] != make_world("people", seed=4).facts[0]


def test_answers_are_checked_at_word_boundaries_and_numbers_by_value():
    assert answer_is_right("It is Velmora Dynamics.", "Velmora Dynamics")
    assert not answer_is_right("Velmora", "Velmora Dynamics")
    assert answer_is_right("about 150 centimetres", "150 cm")
    assert not answer_is_right("1150 cm", "150 cm")
    assert answer_is_right("It costs $1,299", "$1299")
    assert answer_is_right("born 1970", "1970") and not answer_is_right("19700", "1970")


def test_command_line_writes_corpus_and_questions(tmp_path, capsys):
    assert main(["--domain", "species", "--out", str(tmp_path), "--facts-per-level", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = [json.loads(x) for x in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    questions = (tmp_path / "questions.jsonl").read_text().splitlines()
    assert summary["documents"] == len(rows) and summary["questions"] == len(questions)
    assert {"doc_id", "text"} <= set(rows[0])

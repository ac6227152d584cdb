"""Natural-text fact worlds (`dpsynth.evaluation.natural_world`): each fact stated in exactly its
number of documents, in natural styles, with questions whose answer is in no release."""

import pytest

from dpsynth.evaluation.natural_world import (
    DOMAINS,
    TEST_DOMAINS,
    VALIDATION_DOMAIN,
    make_natural_world,
    natural_answer_is_right,
)


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_fact_is_stated_in_exactly_its_support(domain):
    world = make_natural_world(domain, facts_per_level=2, seed=3)
    assert len(world.facts) == 12
    for fact in world.facts:
        stating = [t for t in world.documents if natural_answer_is_right(t, fact.value)]
        assert len(stating) == fact.support, fact
        # the subject is in every document that states its fact (typos spare it)
        assert all(fact.subject.lower() in t.lower() for t in stating), fact


def test_documents_are_natural_and_some_state_several_facts():
    world = make_natural_world(VALIDATION_DOMAIN, seed=0)
    text = "\n".join(world.documents)
    for mark in ("Ticket #", "Subject:", "From:", "] ", "Handover notes", "note 2026-"):
        assert mark in text, mark
    several = [
        t for t in world.documents
        if sum(natural_answer_is_right(t, f.value) for f in world.facts) >= 2
    ]  # fmt: skip
    assert len(several) >= 10
    assert any(f.value.startswith("Team ") for f in world.facts)  # an ordinary word
    assert world.documents == make_natural_world(VALIDATION_DOMAIN, seed=0).documents
    assert world.documents != make_natural_world(VALIDATION_DOMAIN, seed=1).documents


def test_questions_whose_answer_is_in_no_release():
    world = make_natural_world("lab", seed=0)
    never = [q for q in world.questions if q.support == 0]
    assert len(never) == len({f.subject for f in world.facts}) and all(
        q.answer == "" for q in never
    )
    assert sum(q.support == 1 for q in world.questions) == 5
    assert set(TEST_DOMAINS) | {VALIDATION_DOMAIN} == set(DOMAINS)


def test_an_answer_is_right_only_when_it_states_the_whole_value():
    assert natural_answer_is_right("Logs are kept for 45 days.", "45 days")
    assert not natural_answer_is_right("45", "45 days")
    assert not natural_answer_is_right("10.40", "10.40.2.17")
    assert natural_answer_is_right("It is at 10.40.2.17.", "10.40.2.17")
    assert not natural_answer_is_right("10.40.2.170", "10.40.2.17")
    assert natural_answer_is_right("sundays 02:00\u201304:00 utc", "Sundays 02:00-04:00 UTC")
    assert not natural_answer_is_right("02", "Sundays 02:00-04:00 UTC")
    assert not natural_answer_is_right("anything", "")

"""Answers from a typed fact release (`retriever.typed_answers`): the subject, the kind the
question asks, the value the counts support, and abstention when the release cannot tell."""

import pytest

from retriever.fact_answers import ABSTAIN
from retriever.typed_answers import TypedFactAnswerer, question_kinds
from synthgen.knowledge.facts import fact_records
from synthgen.knowledge.typed_facts import fact_key

FACTS = {
    fact_key("the payments gateway", "Team Heron"): 31.0,
    fact_key("the payments gateway", "10.70.240.43"): 28.0,
    fact_key("the payments gateway", "v2.28.5"): 25.0,
    fact_key("Dara Quill", "Velmora Dynamics"): 20.0,
    fact_key("Dara Quill", "Poswick"): 19.6,  # within the noise of a place... and a company
    fact_key("Velmora Dynamics", "Bo Kestrin"): 14.0,
}


@pytest.fixture
def answerer():
    return TypedFactAnswerer(fact_records(FACTS, 8, "typed"), noise_stddev=0.55)


def test_the_question_picks_the_kind(answerer):
    assert answerer.answer("Which team owns the payments gateway?").answer == "Team Heron"
    assert answerer.answer("What is the IP address of the Payments gateway?").answer == (
        "10.70.240.43"
    )
    assert answerer.answer("Which version does the payments gateway run?").answer == "v2.28.5"
    assert answerer.answer("Which company does Dara Quill work for?").answer == ("Velmora Dynamics")
    assert answerer.answer("In which town did Dara Quill grow up?").answer == "Poswick"


def test_a_value_named_by_the_question_answers_from_its_subject(answerer):
    found = answerer.answer("Which company employs Bo Kestrin?")
    assert found.answer == "Velmora Dynamics" and not found.abstained


def test_abstains_rather_than_naming_another_relation(answerer):
    for question in (
        "When is the payments gateway patched?",  # no time window released
        "How long are the logs of the payments gateway kept?",  # no duration
        "What is the disaster-recovery site of the payments gateway?",  # no place
        "Who discovered the Quorbin halvex?",  # no such subject
        "Tell me about the payments gateway.",  # asks no kind a rule reads
    ):
        found = answerer.answer(question)
        assert found.abstained and found.answer == ABSTAIN, question


def test_abstains_when_two_values_of_the_kind_are_within_the_noise():
    close = {fact_key("the lab", "room 1.02"): 20.0, fact_key("the lab", "room 3.40"): 19.8}
    answerer = TypedFactAnswerer(fact_records(close, 8, "typed"), noise_stddev=0.55)
    assert answerer.answer("Which room is the lab in?").abstained
    apart = {fact_key("the lab", "room 1.02"): 30.0, fact_key("the lab", "room 3.40"): 19.8}
    answerer = TypedFactAnswerer(fact_records(apart, 8, "typed"), noise_stddev=0.55)
    assert answerer.answer("Which room is the lab in?").answer == "room 1.02"


def test_question_kinds_are_a_public_rule():
    assert question_kinds("What is the IP address of x?") == {"ip", "host"}
    assert question_kinds("When is x cleaned?") == {"window"}
    assert question_kinds("How many people does x hold?") == {"count"}
    assert question_kinds("Tell me about x.") == frozenset()
    with pytest.raises(ValueError):
        TypedFactAnswerer([], noise_stddev=0.0)


def test_a_value_several_named_subjects_share_adds_their_counts():
    facts = {
        fact_key("dalorish cramps", "Gruquind palsy"): 9.0,
        fact_key("vitrilish rash", "Gruquind palsy"): 8.0,
        fact_key("dalorish cramps", "Sefonemia"): 12.0,  # a symptom two diseases share
        fact_key("dalorish cramps", "Erika Holm"): 30.0,  # a person: not a disease's kind
    }
    answerer = TypedFactAnswerer(fact_records(facts, 8, "typed"), noise_stddev=0.55)
    found = answerer.answer("Which disease causes dalorish cramps and vitrilish rash?")
    assert found.answer == "Gruquind palsy" and found.scores["Gruquind palsy"] == 17.0
    diagnosis = "What is the diagnosis for a patient with vitrilish rash and dalorish cramps?"
    assert answerer.answer(diagnosis).answer == "Gruquind palsy"
    assert answerer.answer("Which disease causes dalorish cramps?").answer == "Sefonemia"


def test_a_subject_the_question_asks_as_a_relation_is_not_what_it_names():
    facts = {
        fact_key("keeper", "Tomasz Drutruldren"): 7.0,  # "The keeper: Tomasz ..." somewhere
        fact_key("the autoclave", "room 2.39"): 41.0,
        fact_key("the plate reader", "Hana Kunvirkos"): 15.0,
    }
    answerer = TypedFactAnswerer(fact_records(facts, 8, "typed"), noise_stddev=0.55)
    found = answerer.answer("Who is the keeper of the autoclave?")
    assert found.abstained and found.records == ["autoclave"]
    assert answerer.answer("Who is the keeper of the plate reader?").answer == "Hana Kunvirkos"
    assert answerer.answer("Who is the keeper?").answer == "Tomasz Drutruldren"


def test_where_asks_a_place_and_when_was_a_date():
    assert question_kinds("Where is the gel imager?") == frozenset({"room", "place", "name"})
    assert "share" in question_kinds("Where does the gel imager write its data?")
    assert question_kinds("When was the east wing last renovated?") == frozenset({"year"})
    assert question_kinds("When is the east wing cleaned?") == frozenset({"window"})
    facts = {
        fact_key("the gel imager", "\\\\fs19\\data72"): 30.0,
        fact_key("the east wing", "Saturdays 04:00-08:00 UTC"): 25.0,
    }
    answerer = TypedFactAnswerer(fact_records(facts, 8, "typed"), noise_stddev=0.55)
    assert answerer.answer("Where is the gel imager?").abstained  # a share is not a place
    assert answerer.answer("When was the east wing last renovated?").abstained
    assert answerer.answer("When is the east wing cleaned?").answer.startswith("Saturdays")

"""Answers from a fact release: the named phrase's partners, typed by the LM, or abstain."""

from __future__ import annotations

from retriever.fact_answers import ABSTAIN, FactAnswerer
from synthgen.knowledge.facts import fact_records
from synthgen.knowledge.phrases import pair_key
from synthgen.lm_backends import TinyLM

PAIRS = {
    pair_key("Dara Quill", "Velmora Dynamics"): 30.0,
    pair_key("Dara Quill", "1970"): 20.0,
    pair_key("Bo Kestrin", "Tarnwick"): 12.0,
}


def test_a_question_naming_nothing_released_abstains():
    answerer = FactAnswerer(fact_records(PAIRS, 8), TinyLM())
    found = answerer.answer("Where does Zorvik Plenthe live?")
    assert found.abstained and found.answer == ABSTAIN and found.records == []


def test_one_partner_is_the_answer_and_names_its_record():
    answerer = FactAnswerer(fact_records(PAIRS, 8), TinyLM())
    found = answerer.answer("In which town did Bo Kestrin grow up?")
    assert not found.abstained and found.answer == "Tarnwick" and found.records == ["Bo Kestrin"]


def test_several_partners_the_answer_is_one_of_them_never_the_question_s_own():
    answerer = FactAnswerer(fact_records(PAIRS, 8), TinyLM())
    named, candidates = answerer.candidates("Which company does Dara Quill work for?")
    assert named == ["Dara Quill"] and set(candidates) == {"Velmora Dynamics", "1970"}
    found = answerer.answer("Which company does Dara Quill work for?")
    assert found.answer in candidates and set(found.scores) == set(candidates)
    # a question naming both phrases of a pair: the partner it names is no answer
    named, candidates = answerer.candidates("Does Dara Quill work at Velmora Dynamics?")
    assert "Velmora Dynamics" not in candidates and "Dara Quill" not in candidates


def test_a_question_naming_several_phrases_asks_what_links_them():
    pairs = {
        pair_key("stibrenish", "Besox"): 30.0,
        pair_key("statirish", "Besox"): 25.0,
        pair_key("stibrenish", "Zolozane"): 28.0,
        pair_key("statirish", "Madox"): 9.0,
    }
    answerer = FactAnswerer(fact_records(pairs, 8), TinyLM())
    question = "Which disease causes stibrenish blisters and statirish swelling?"
    named, candidates = answerer.candidates(question)
    assert set(named) == {"stibrenish", "statirish"} and candidates == ["Besox"]
    assert answerer.answer(question).answer == "Besox"

"""`retriever.rag.keyword_vote`: answer keywords, their DP partition selection, its threshold.

The selection is PipelineDP's (python-dp's secure noise, no seed), so its distribution is
checked by Monte-Carlo: the release rate of a keyword held by n voters against python-dp's
closed form, a canary keyword held by one voter never released, and the release rate
moving by at most the charged (epsilon, delta) between neighbouring voter sets (add/remove
and swap).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from retriever.rag.keyword_vote import (
    answer_keywords,
    final_answer,
    group_parameters,
    keyword_document,
    keyword_threshold,
    normalise,
    question_focus,
    release_answer_keywords,
)
from retriever.rag.plan import make_plan
from synthgen.privacy.partition_selection import keep_probability

CANARY = "zqxcanaryvorpal"


def test_keywords_are_normalised_words_at_most_k_once_each():
    assert normalise("Blisters") == "blister" and normalise("allergies") == "allergy"
    assert normalise("Trudrosis") == "trudrosis" and normalise("virus") == "virus"
    assert answer_keywords("The disease is Besox fever.", 2) == ["besox", "fever"]
    assert answer_keywords("Besox, besox fever; FEVERS", 4) == ["besox", "fever"]
    assert answer_keywords("", 3) == [] and answer_keywords("It is the a", 3) == []
    assert "besox" in keyword_document(["besox", "fever"])
    # the question's own words are not an answer's keywords
    asked = "Which disease causes tadrunic numbness?"
    assert answer_keywords("Tadrunic numbness, then Besox", 2, asked) == ["besox"]
    # the answer's framing is not a keyword either
    assert answer_keywords("The most likely cause is Besox", 1) == ["besox"]
    assert answer_keywords("It does: Besox", 1) == ["besox"]


def test_numbers_and_names_of_several_words_are_keys():
    """A year, a price or a length is a key (digits only); a name of several capitalised
    words is one key, lower case as spelled (no plural folding); punctuation ends a name."""
    asked = "In which year was Sobrer Lofos born?"
    assert answer_keywords("Sobrer Lofos was born in 1988.", 1, asked) == ["1988"]
    assert answer_keywords("It costs $639.", 2) == ["cost", "639"]
    assert answer_keywords("150 cm.", 1) == ["150"]
    asked = "Which company does Kelmos Brunkon work for?"
    answer = "Kelmos Brunkon works at Ferpil Industries."
    assert answer_keywords(answer, 1, asked) == ["ferpil industries"]
    assert answer_keywords("Ferpil Industries. Tredar Labs", 2) == [
        "ferpil industries",
        "tredar labs",
    ]
    # lower-case words stay apart, as before: "Besox fever" is two keys
    assert answer_keywords("The disease is Besox fever.", 2) == ["besox", "fever"]
    # the rarest word ranks its whole name
    counts = {"Ferpil": 3, "Industries": 1}
    ranked = answer_keywords(answer, 1, asked, word_tokens=lambda w: counts.get(w, 1))
    assert ranked == ["ferpil industries"]


def test_a_voter_counts_only_for_what_its_own_document_says_about_the_asked_thing():
    """The question's rarest words (most tokens) must be in the voter's document, and a
    key must be spelled there; without a document nothing is checked."""
    counts = {"Kelmos": 2, "Brunkon": 2}

    def tokens(word):
        return counts.get(word, 1)

    asked = "Which company does Kelmos Brunkon work for?"
    assert question_focus(asked, tokens) == {"kelmos", "brunkon"}
    assert question_focus(asked) == {"company", "kelmos", "brunkon", "work"}
    assert question_focus("What is it?") == set()
    relevant = "Ferpil Industries employs Kelmos Brunkon as an engineer."
    other = "Sobrer Lofos works at Brarki Partners."
    said = "Sobrer Lofos is a company that works for Kelmos Brunkon."
    assert answer_keywords(said, 1, asked, tokens) == ["sobrer lofos"]
    assert answer_keywords(said, 1, asked, tokens, document=other) == []  # off the question
    right = "Kelmos Brunkon works at Ferpil Industries."
    assert answer_keywords(right, 1, asked, tokens, document=relevant) == ["ferpil industries"]
    # made up: "1970" and "document" are not in the document, "ferpil" is
    made_up = "The document says Ferpil, since 1970."
    assert answer_keywords(made_up, 3, asked, tokens, document=relevant) == ["ferpil"]
    assert (
        answer_keywords("Kelmos Brunkon works at Vuvu Systems.", 1, asked, tokens, relevant) == []
    )
    # no content word in the question: every document reads it
    assert answer_keywords("Besox", 1, "what is it?", None, document="Besox fever") == ["besox"]


def test_the_release_counts_the_voters_that_read_the_asked_thing():
    """20 voters read the asked entity's documents and name its employer; 30 read another
    entity's and name that entity. Without the documents the wrong name is released;
    with them only the right one can be (30 and 20 votes against a threshold of 13.6)."""
    counts = {"Kelmos": 2, "Brunkon": 2, "Sobrer": 2, "Lofos": 3, "Ferpil": 3}

    def tokens(word):
        return counts.get(word, 1)

    asked = "Which company does Kelmos Brunkon work for?"
    answers = ["Kelmos Brunkon works at Ferpil Industries."] * 20 + [
        "Sobrer Lofos is a company that works for Kelmos Brunkon."
    ] * 30
    documents = ["Kelmos Brunkon works at Ferpil Industries."] * 20 + [
        "Sobrer Lofos works at Brarki Partners."
    ] * 30
    kwargs = dict(epsilon=5.0, delta=1e-6, max_keywords=1, question=asked, word_tokens=tokens)
    assert release_answer_keywords(answers, **kwargs)[0] == "sobrer lofos"
    released = release_answer_keywords(answers, documents=documents, **kwargs)
    assert released == ["ferpil industries"]
    with pytest.raises(ValueError, match="one document per answer"):
        release_answer_keywords(answers, documents=documents[:3], **kwargs)


def test_a_rare_word_beats_the_answers_framing_under_a_public_tokenizer():
    """With a token count (SmolLM2's: "causing" 1 token, "Zotrilosis" 4), the rarest words
    come first; without one, or on ties, the answer's order holds."""
    counts = {"causing": 1, "flushing": 1, "Zotrilosis": 4, "Madox": 2, "syndrome": 1}
    answer = "The disease causing flushing is Zotrilosis"
    assert answer_keywords(answer, 1) == ["causing"]
    assert answer_keywords(answer, 1, word_tokens=counts.get) == ["zotrilosis"]
    assert answer_keywords("Madox syndrome", 2, word_tokens=counts.get) == ["madox", "syndrome"]
    assert answer_keywords("syndrome Madox", 1, word_tokens=lambda w: 1) == ["syndrome"]
    released = release_answer_keywords(
        [answer] * 400, epsilon=5.0, delta=1e-6, max_keywords=1, word_tokens=counts.get
    )
    assert released == ["zotrilosis"]


def test_the_final_answer_names_a_released_keyword():
    assert final_answer("Besox fever", ["besox"]) == "Besox fever"
    assert final_answer("- 20", ["besox", "madox"]) == "Besox"
    # a name of several words: every word said, or the name itself
    assert final_answer("At Ferpil Industries.", ["ferpil industries"]) == "At Ferpil Industries."
    assert final_answer("At Ferpil.", ["ferpil industries"]) == "Ferpil Industries"
    assert final_answer("In 1988.", ["1988"]) == "In 1988."


def _rate(answers, epsilon, runs, delta=1e-6, keyword="besox"):
    hits = sum(
        keyword in release_answer_keywords(answers, epsilon=epsilon, delta=delta, max_keywords=2)
        for _ in range(runs)
    )
    return hits / runs


@pytest.mark.slow
def test_the_release_rate_matches_the_closed_form():
    epsilon, delta = 4.0, 1e-6
    eps, dlt = group_parameters(epsilon, delta)
    threshold = keyword_threshold(epsilon, delta, 2)
    n = int(round(threshold))  # near the threshold: a rate well inside (0, 1)
    expected = keep_probability(n, eps, dlt, 2)
    assert 0.1 < expected < 0.9
    runs = 600
    rate = _rate(["Besox fever"] * n, epsilon, runs, delta)
    assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / runs)


@pytest.mark.slow
def test_a_keyword_of_one_voter_is_never_released():
    answers = ["Besox fever"] * 40 + [f"{CANARY} pox"]
    for _ in range(200):
        out = release_answer_keywords(answers, epsilon=10.0, delta=1e-6, max_keywords=2)
        assert "besox" in out and CANARY not in out


@pytest.mark.slow
def test_neighbouring_voter_sets_move_the_release_by_at_most_the_charge():
    """P[besox released | D] <= e^eps P[... | D'] + delta, both ways, for D' = D minus one
    voter (add/remove) and D' = D with one voter changed (swap), estimated by Monte-Carlo
    with a 4-sigma allowance."""
    epsilon, delta, runs = 1.0, 1e-6, 1500
    eps, dlt = group_parameters(epsilon, delta)
    n = int(round(keyword_threshold(epsilon, delta, 2)))
    base = ["Besox fever"] * n
    neighbours = {
        "remove": base[:-1],
        "swap": base[:-1] + ["Madox syndrome"],
    }
    p = _rate(base, epsilon, runs, delta)
    for name, other in neighbours.items():
        q = _rate(other, epsilon, runs, delta)
        slack = 4 * math.sqrt(max(p, q, 1 / runs) / runs)
        assert p <= math.exp(epsilon) * q + delta + slack, name
        assert q <= math.exp(epsilon) * p + delta + slack, name
    assert keep_probability(n, eps, dlt, 2) > 0.05  # the test has power


def test_the_plan_charges_one_release_within_the_target():
    plan = make_plan("keywords", 5.0, delta=1e-6, max_tokens=5)
    assert plan.max_releases == 1 and plan.worst_case_epsilon() <= 5.0 * (1 + 1e-6)
    summary = plan.vote_summary(64, max_keywords=2)
    assert summary["keyword_threshold"] == pytest.approx(
        keyword_threshold(plan.token_epsilon, plan.token_delta, 2)
    )
    assert summary["release_possible"] is True
    tight = make_plan("keywords", 1.0, delta=1e-6, max_tokens=5).vote_summary(32)
    assert tight["release_possible"] is False  # 32 voters cannot clear it at epsilon 1


def test_nothing_to_release_is_an_empty_list():
    assert release_answer_keywords(["", "the"], epsilon=5.0, delta=1e-6, max_keywords=2) == []
    with pytest.raises(ValueError):
        release_answer_keywords(["a b"], epsilon=0.0, delta=1e-6, max_keywords=2)
    assert np.isfinite(keyword_threshold(5.0, 1e-6, 1))

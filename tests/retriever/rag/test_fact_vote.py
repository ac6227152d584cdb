"""The facts mechanism: each document votes the values its typed facts give for the question."""

import numpy as np
import pytest

from retriever.rag import DPRag, PromptFormat, RagConfig, ScoreRange
from retriever.rag.answer_types import ABSTENTION_TEXT
from retriever.rag.fact_vote import document_facts, document_votes, fact_vote
from retriever.rag.question_kinds import decide
from synthgen.knowledge.typed_facts import record_facts
from synthgen.lm_backends import TinyLM
from synthgen.privacy import PrivacyLedger, Scope
from synthgen.privacy.partition_selection import noise_stddev, selection_threshold
from synthgen.privacy.receipts import collection_payer


def _votes(text, question, k=1, relation="kind"):
    return document_votes(record_facts(text, 64), question, k, relation)


def test_a_document_votes_the_value_of_the_kind_asked_about_the_subject_named():
    text = (
        "Hi all, Team Heron owns the payments gateway. "
        "The payments gateway runs version v2.28.5 on 10.40.2.17."
    )
    assert _votes(text, "Which team owns the payments gateway?") == ["Team Heron"]
    assert _votes(text, "Which version does the payments gateway run?") == ["v2.28.5"]
    assert _votes(text, "What is the IP address of the payments gateway?") == ["10.40.2.17"]
    # another subject, or a kind the document does not state: no vote
    assert _votes(text, "Which team owns the billing service?") == []
    assert _votes(text, "When is the maintenance window of the payments gateway?") == []


def test_a_question_that_names_the_value_votes_for_its_subject():
    text = "Dara Quill works at Velmora Dynamics, in the Lisbon office."
    assert _votes(text, "Which company does Dara Quill work for?") == ["Velmora Dynamics"]
    assert _votes(text, "Which company employs Dara Quill?") == ["Velmora Dynamics"]


def test_no_kind_rule_needs_the_relation_words_and_words_mode_always_does():
    text = "The glassworks of Velliscourt is famous for Brenolite lamps."
    facts = record_facts(text, 64)
    assert facts, "the rule finds the name"
    # no kind rule reads "famous": the relation words must meet the question's
    assert document_votes(facts, "What is Velliscourt famous for?", 1) != []
    assert document_votes(facts, "What is Velliscourt's motto?", 1) == []
    team = record_facts("Team Heron owns the payments gateway.", 64)
    assert document_votes(team, "Who approved the payments gateway?", 1) == ["Team Heron"]
    assert document_votes(team, "Who approved the payments gateway?", 1, "words") == []
    with pytest.raises(ValueError, match="relation"):
        document_votes(team, "Who owns the payments gateway?", 1, "verbs")


def test_a_disease_question_is_read_and_each_record_votes_its_diagnosis():
    record = (
        "Mei Jensen (60) reported vumanish cough, dalorish cramps and groflonent itch "
        "and was diagnosed with Sefonemia; Branurafen was prescribed."
    )
    asked = "Which disease causes dalorish cramps and vumanish cough?"
    assert _votes(record, asked) == ["Sefonemia"]
    assert _votes(record, "A patient presents with groflonent itch. Which disease is it?") == [
        "Sefonemia"
    ]
    assert _votes(record, "Which disease causes tadrunic numbness?") == []  # not stated


def test_a_subject_asked_as_a_relation_gets_no_vote():
    text = "The keeper is Tomasz Drutruldren. The autoclave is in room 2.39."
    assert _votes(text, "Who is the keeper of the autoclave?") == []
    assert _votes(text, "Who is the keeper?") == ["Tomasz Drutruldren"]


def test_a_document_gives_at_most_k_distinct_values():
    text = "Team Heron owns the payments gateway. Team Otter owns the payments gateway too."
    question = "Which team owns the payments gateway?"
    assert len(_votes(text, question, k=1)) == 1
    assert sorted(_votes(text, question, k=2)) == ["Team Heron", "Team Otter"]


def test_the_value_many_documents_state_is_the_answer_and_a_secret_never_is():
    """40 documents state the owner, 2 a wrong one, 1 a secret of another subject. At
    epsilon 5 the owner's count (~40) is far over the threshold (~6) and the gap; the
    secret is released with probability at most delta."""
    texts = (
        ["Team Heron owns the payments gateway, as agreed."] * 40
        + ["Team Falcon owns the payments gateway."] * 2
        + ["Team Comet owns the secret vault."]
        + ["Lunch is at noon on Fridays."] * 20
    )
    facts = document_facts(texts)
    answer, counts = fact_vote(
        facts, "Which team owns the payments gateway?", epsilon=5.0, delta=1e-6
    )
    assert answer == "Team Heron"
    assert 40 - 8 * noise_stddev(5.0, 1e-6, 1) < counts["Team Heron"]
    assert selection_threshold(5.0, 1e-6, 1) > 3  # two documents are not enough
    secret, counts = fact_vote(facts, "Which team owns the secret vault?", epsilon=5.0, delta=1e-6)
    assert secret is None and counts == {}


def test_decide_needs_the_first_value_to_lead_by_the_margin():
    assert decide({"a": 30.0, "b": 10.0}, 2.0) == "a"
    assert decide({"a": 30.0, "b": 29.0}, 2.0) is None
    assert decide({"a": 30.0}, 2.0) == "a"
    assert decide({}, 2.0) is None


N = 30


def _rag(tmp_path, texts):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(len(texts), 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("alice", "records", 1000.0, 1e-5, accountant="basic"))
    return DPRag(
        [f"d{i}" for i in range(len(texts))],
        texts,
        emb,
        lambda qs: emb[:1],
        TinyLM(eos_after_newline=50.0),
        payer=collection_payer(ledger, "records"),
        config=RagConfig(k=8, max_tokens=3, score_range=ScoreRange(-1.0, 1.0)),
        prompt=PromptFormat(chat=False, instruction="a"),
        rng=np.random.default_rng(0),
    ), ledger


def test_dprag_facts_answers_a_kind_question_from_every_document(tmp_path):
    """All 30 documents vote, not only the k = 8 the threshold aims at; the answer is the
    released value, charged the plan's retrieval and one release like keywords."""
    texts = ["Team Heron owns the payments gateway."] * N + ["Nothing to see here."] * 10
    rag, ledger = _rag(tmp_path, texts)
    answer = rag.answer(
        "Which team owns the payments gateway?", tenant="alice", epsilon=5.0, mechanism="facts"
    )
    assert answer.text == "Team Heron" and not answer.abstained
    assert [c.stage for c in answer.charges] == ["retrieval", "tokens"]
    plan = rag.plan("facts", 5.0)
    assert plan.max_releases == 1 and plan.worst_case_epsilon() <= 5.0 * (1 + 1e-9)
    assert [c.stage for c in ledger.charges("alice", "records")] == ["rag-retrieval", "rag-tokens"]
    # the same event shape as keywords: one release at the same (epsilon, delta)
    keywords = rag.plan("keywords", 5.0)
    assert (plan.token_epsilon, plan.token_delta) == (keywords.token_epsilon, keywords.token_delta)


def test_dprag_facts_abstains_on_a_subject_no_document_names(tmp_path):
    texts = ["Team Heron owns the payments gateway."] * N
    rag, _ = _rag(tmp_path, texts)
    answer = rag.answer(
        "Which team owns the billing service?", tenant="alice", epsilon=5.0, mechanism="facts"
    )
    assert answer.abstained and answer.text == ABSTENTION_TEXT


def test_dprag_facts_answers_a_question_no_kind_rule_reads_by_keywords(tmp_path, monkeypatch):
    """A question no kind rule reads goes to the keywords release (the same event)."""
    from retriever.rag import releases

    called = []
    original = releases.keywords

    def spy(*args, **kwargs):
        called.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(releases, "keywords", spy)
    rag, _ = _rag(tmp_path, ["Team Heron owns the payments gateway."] * N)
    rag.answer("a:", tenant="alice", epsilon=5.0, mechanism="facts")
    assert called
    called.clear()
    rag.answer(
        "Which team owns the payments gateway?", tenant="alice", epsilon=5.0, mechanism="facts"
    )
    assert not called

"""Released answers handed out again (`retriever.rag.reuse`): a repeated question costs no
charge, no document's loss and no decode; what is a repeat, and for whom."""

import types

import pytest

from retriever.rag.retrieval import ScoreRange
from retriever.rag.reuse import ReleasedAnswers, question_key
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope
from synthgen.privacy.document_filters import DocumentFilters
from tests.retriever.service.harness import tiny_rag
from tests.retriever.service.test_individual_tenants import INDIVIDUAL, _filters


def test_question_key_ignores_case_spacing_and_final_punctuation():
    assert question_key("  Which  disease causes\tRASH? ") == "which disease causes rash"
    assert question_key("which disease causes rash") == question_key("Which disease causes rash!")
    assert question_key("which disease causes a rash") != question_key("which disease causes rash")


def _collection_rag(tmp_path, scope="tenant"):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope(COLLECTION, "records", 100.0, 1e-5))
    for tenant in ("alice", "bob"):
        ledger.ensure_scope(Scope(tenant, "records", 50.0, 1e-5))
    rag = tiny_rag(ledger, "records")
    rag.answers = ReleasedAnswers(scope)
    return rag, ledger


def test_a_repeated_question_is_the_same_release_and_charges_nothing(tmp_path, monkeypatch):
    rag, ledger = _collection_rag(tmp_path)
    first = rag.answer("What does record 3 say?", tenant="alice", epsilon=2.0)
    charges = len(ledger.charges("alice", "records"))
    monkeypatch.setattr(rag, "_release", lambda *a: pytest.fail("decoded a repeat"))
    again = rag.answer("what does record 3 say", tenant="alice", epsilon=2.0)
    assert again.reused and not first.reused and again.charges == ()
    assert (again.text, again.ref, again.epsilon) == (first.text, first.ref, first.epsilon)
    assert len(ledger.charges("alice", "records")) == charges  # nothing new
    assert again.remaining_epsilon == pytest.approx(first.remaining_epsilon)
    monkeypatch.undo()
    other_epsilon = rag.answer("What does record 3 say?", tenant="alice", epsilon=3.0)
    assert not other_epsilon.reused  # another event: answered and charged
    assert len(ledger.charges("alice", "records")) > charges


@pytest.mark.parametrize(("scope", "bob_reuses"), [("tenant", False), ("shared", True)])
def test_the_scope_decides_who_gets_an_answer_again(tmp_path, scope, bob_reuses):
    rag, ledger = _collection_rag(tmp_path, scope)
    first = rag.answer("What does record 3 say?", tenant="alice", epsilon=2.0)
    bob = rag.answer("What does record 3 say?", tenant="bob", epsilon=2.0)
    assert bob.reused == bob_reuses
    assert (len(ledger.charges("bob", "records")) == 0) == bob_reuses
    if bob_reuses:
        assert bob.ref == first.ref


def test_individual_accounting_documents_pay_once_for_a_repeated_question(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    _filters(ledger)
    ledger.ensure_scope(Scope("alice", "records", 50.0, 1e-5, accountant="rdp"))
    rag = tiny_rag(ledger, "records", score_range=ScoreRange(-1.0, 1.0), **INDIVIDUAL)
    rag.answers = ReleasedAnswers()
    filters = DocumentFilters(ledger.store)
    first = rag.answer("q", tenant="alice", epsilon=1.0)
    losses = filters.losses("records", rag.doc_ids).copy()
    assert losses.sum() > 0 and not first.reused
    for _ in range(3):
        assert rag.answer("Q?", tenant="alice", epsilon=1.0).reused
    assert (filters.losses("records", rag.doc_ids) == losses).all()
    assert filters.verify("records") == 0


def test_abstentions_and_truncated_answers_are_not_kept():
    answers = ReleasedAnswers()
    plan = types.SimpleNamespace(mechanism="icl", epsilon=1.0, delta=1e-6)
    for abstained, truncated in ((True, False), (False, True)):
        answer = types.SimpleNamespace(abstained=abstained, truncated=truncated)
        answers.put("alice", "q", plan, answer)
    assert len(answers) == 0 and answers.get("alice", "q", plan) is None
    with pytest.raises(ValueError, match="scope must be one of"):
        ReleasedAnswers("everyone")

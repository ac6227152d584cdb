"""Released answers handed out again (`retriever.rag.reuse`): a repeated question costs no
charge, no document's loss and no decode; what is a repeat, and for whom."""

import dataclasses
import types

import numpy as np
import pytest

from retriever.rag.retrieval import ScoreRange
from retriever.rag.reuse import ReleasedAnswers, question_key
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope
from synthgen.privacy.document_filters import DocumentFilters
from synthgen.privacy.ledger_types import EventShapeError
from tests.dpsynth.service.harness import tiny_rag
from tests.dpsynth.service.test_individual_tenants import INDIVIDUAL, _filters

QUESTION = "What does record 3 say?"


def test_question_key_ignores_case_spacing_and_final_punctuation():
    assert question_key("  Which  disease causes\tRASH? ") == "which disease causes rash"
    assert question_key("which disease causes rash") == question_key("Which disease causes rash!")
    assert question_key("which disease causes a rash") != question_key("which disease causes rash")


def _seeded(rag):
    rag._rng = np.random.default_rng(1)  # a first answer that does not abstain
    return rag


def _collection_rag(tmp_path, scope="tenant"):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope(COLLECTION, "records", 100.0, 1e-5))
    for tenant in ("alice", "bob"):
        ledger.ensure_scope(Scope(tenant, "records", 50.0, 1e-5))
    rag = _seeded(tiny_rag(ledger, "records"))
    rag.answers = ReleasedAnswers(scope)
    return rag, ledger


def _individual_rag(tmp_path, scope="tenant"):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    _filters(ledger)
    for tenant in ("alice", "bob"):
        ledger.ensure_scope(Scope(tenant, "records", 50.0, 1e-5, accountant="rdp"))
    rag = _seeded(tiny_rag(ledger, "records", score_range=ScoreRange(-1.0, 1.0), **INDIVIDUAL))
    rag.answers = ReleasedAnswers(scope)
    return rag, ledger


def test_a_repeated_question_is_the_same_release_and_charges_nothing(tmp_path, monkeypatch):
    rag, ledger = _collection_rag(tmp_path)
    first = rag.answer(QUESTION, tenant="alice", epsilon=2.0)
    assert not first.abstained and not first.reused  # the precondition of what follows
    charges = len(ledger.charges("alice", "records"))
    monkeypatch.setattr(rag, "_release", lambda *a: pytest.fail("decoded a repeat"))
    again = rag.answer("what does record 3 say", tenant="alice", epsilon=2.0)
    assert again.reused and again.charges == ()
    assert (again.text, again.ref, again.epsilon) == (first.text, first.ref, first.epsilon)
    assert len(ledger.charges("alice", "records")) == charges  # nothing new
    assert again.remaining_epsilon == pytest.approx(first.remaining_epsilon)
    monkeypatch.undo()
    # Another event is never served from the stored answers: it reaches the charge, where
    # the collection cap's one event refuses it (nothing charged).
    for other in (
        lambda: rag.answer(QUESTION, tenant="alice", epsilon=3.0),  # another epsilon
        lambda: rag.answer(QUESTION, tenant="alice", epsilon=2.0, mechanism="keywords"),
        lambda: rag.with_config(dataclasses.replace(rag.config, max_tokens=1)).answer(
            QUESTION, tenant="alice", epsilon=2.0
        ),  # another config: another event
    ):
        with pytest.raises(EventShapeError):
            other()
        assert len(ledger.charges("alice", "records")) == charges


def test_shared_answers_are_refused_under_collection_accounting(tmp_path):
    rag, _ = _collection_rag(tmp_path, "shared")
    with pytest.raises(ValueError, match="shared released answers need individual"):
        rag.answer(QUESTION, tenant="alice", epsilon=2.0)


@pytest.mark.parametrize(("scope", "bob_reuses"), [("tenant", False), ("shared", True)])
def test_the_scope_decides_who_gets_an_answer_again(tmp_path, scope, bob_reuses):
    rag, ledger = _individual_rag(tmp_path, scope)
    first = rag.answer(QUESTION, tenant="alice", epsilon=1.0)
    assert not first.abstained
    bob = rag.answer(QUESTION, tenant="bob", epsilon=1.0)
    assert bob.reused == bob_reuses
    assert (len(ledger.charges("bob", "records")) == 0) == bob_reuses
    if bob_reuses:
        assert bob.text == first.text and bob.ref is None  # not bob's charge
    assert rag.answer(QUESTION, tenant="alice", epsilon=1.0).ref == first.ref


def test_individual_accounting_documents_pay_once_for_a_repeated_question(tmp_path, monkeypatch):
    rag, ledger = _individual_rag(tmp_path)
    filters = DocumentFilters(ledger.store)
    first = rag.answer("q", tenant="alice", epsilon=1.0)
    assert not first.abstained and not first.reused
    losses = filters.losses("records", rag.doc_ids).copy()
    assert losses.sum() > 0
    monkeypatch.setattr(rag, "_decode", lambda *a: pytest.fail("decoded a repeat"))
    for _ in range(3):
        assert rag.answer("Q?", tenant="alice", epsilon=1.0).reused
    assert (filters.losses("records", rag.doc_ids) == losses).all()
    assert filters.verify("records") == 0


def test_abstentions_and_truncated_answers_are_not_kept():
    answers = ReleasedAnswers()
    for abstained, truncated in ((True, False), (False, True)):
        answer = types.SimpleNamespace(abstained=abstained, truncated=truncated)
        answers.put("alice", "q", "event", answer)
    assert len(answers) == 0 and answers.get("alice", "q", "event") is None
    with pytest.raises(ValueError, match="scope must be one of"):
        ReleasedAnswers("everyone")

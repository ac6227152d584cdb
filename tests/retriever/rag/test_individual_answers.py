"""DPRag under individual (per-document) accounting, end to end on the byte-level test LM:
who pays, exclusion at the cap, the quota, refusals, and losses recomputed from the rows."""

import re

import numpy as np
import pytest

from retriever.rag import DPRag, PromptFormat, RagConfig, ScoreRange
from retriever.rag.answer_types import AnswerFailedError
from synthgen.lm_backends import TinyLM
from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope
from synthgen.privacy.document_filters import DocumentFilter, DocumentFilters
from synthgen.privacy.individual import DocumentBudget
from synthgen.privacy.receipts import collection_payer
from tests.retriever.rag.recording_lm import RecordingLM

N = 24
TAU = 0.9  # on the normalised scale of ScoreRange(-1, 1): cosine >= 0.8


class CountingLM(RecordingLM):
    """TinyLM that records each private session's prompts."""

    def start(self, prompts, max_new_tokens, **kwargs):
        if len(prompts) > 1:  # the private rows (the public prompt is alone)
            self.seen.append([self.decode(p) for p in prompts])
        return super().start(prompts, max_new_tokens)


def _world():
    """Documents 0-5 close to question 'near', the rest far from it."""
    rng = np.random.default_rng(0)
    question = np.zeros(8, np.float32)
    question[0] = 1.0
    emb = rng.normal(size=(N, 8)).astype(np.float32)
    emb[:, 0] = -2.0  # far: cosine with the question < 0
    emb[:6] = question + 0.05 * rng.normal(size=(6, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ids = [f"d{i}" for i in range(N)]
    texts = [f"secret-{i} the answer is blue" for i in range(N)]
    return ids, texts, emb, question


def _rag(tmp_path, *, quota=1000.0, document_epsilon=4.0, epsilon=1.0, **config):
    ids, texts, emb, question = _world()
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("alice", "records", quota, 1e-5))
    ledger.ensure_scope(Scope("bob", "records", quota, 1e-5))
    rag_config = RagConfig(
        k=4,
        max_tokens=3,
        score_range=ScoreRange(-1.0, 1.0),
        accounting="individual",
        relevance_threshold=TAU,
        composition="bounded-range",
        **config,
    )
    rho = DPRag.__new__(DPRag)  # the plan's rho, before the collection exists
    rho.config = rag_config
    answer_rho = rho.plan("icl", epsilon).document_rho()
    filters = DocumentFilters(ledger.store)
    filters.open(DocumentFilter("records", DocumentBudget(document_epsilon, 1e-6), answer_rho, N))
    lm = CountingLM()
    rag = DPRag(
        ids,
        texts,
        emb,
        lambda qs: np.stack([question if q == "near" else -question for q in qs]),
        lm,
        payer=collection_payer(ledger, "records"),
        config=rag_config,
        prompt=PromptFormat(chat=False),
        rng=np.random.default_rng(0),
    )
    return rag, ledger, filters, lm, answer_rho


def test_only_relevant_active_documents_pay_and_exhausted_ones_leave_the_prompts(tmp_path):
    rag, ledger, filters, lm, rho = _rag(tmp_path)
    per_document = filters.get("records").answers_per_document
    assert per_document >= 2
    for _ in range(per_document):
        answer = rag.answer("near", tenant="alice", epsilon=1.0)
        assert answer.ref is not None and answer.epsilon <= 1.0 + 1e-9
        assert sum("secret-" in p for p in lm.seen[-1]) == 4  # 6 relevant, 4 rows
    losses = filters.losses("records", [f"d{i}" for i in range(N)])
    np.testing.assert_allclose(losses[:6], per_document * rho)  # all six payers, rows or not
    assert np.all(losses[6:] == 0.0)  # far documents never pay
    # every relevant document is exhausted now: it is in no prompt, and nobody pays
    answer = rag.answer("near", tenant="bob", epsilon=1.0)
    assert not any("secret-" in p for p in lm.seen[-1])
    np.testing.assert_allclose(filters.losses("records", ["d0"]), [per_document * rho])
    assert answer.charges and ledger.spent("bob", "records").epsilon > 0  # the quota pays
    assert filters.verify("records") == 0
    summary = filters.summary("records")
    assert summary["exhausted"] == 6 and summary["active"] == N - 6
    assert summary["max_epsilon"] <= 4.0


def test_a_far_question_charges_no_document(tmp_path):
    rag, _, filters, lm, _ = _rag(tmp_path)
    rag.answer("far", tenant="alice", epsilon=1.0)
    assert not any("secret-" in p for p in lm.seen[-1])
    assert filters.recompute("records") == {}


def test_the_tenant_quota_refuses_before_any_document_pays(tmp_path):
    rag, _, filters, lm, _ = _rag(tmp_path, quota=1.5)
    rag.answer("near", tenant="alice", epsilon=1.0)
    sessions = len(lm.seen)
    with pytest.raises(BudgetExceededError):
        rag.answer("near", tenant="alice", epsilon=1.0)
    assert len(lm.seen) == sessions  # no prompt built
    assert max(filters.recompute("records").values()) == pytest.approx(
        filters.get("records").answer_rho
    )


def test_individual_mode_refuses_what_has_no_zcdp_curve_or_no_filters(tmp_path):
    rag, ledger, _, _, _ = _rag(tmp_path)
    for mechanism in ("keywords", "facts"):
        with pytest.raises(ValueError, match="icl only"):
            rag.answer("near", tenant="alice", epsilon=1.0, mechanism=mechanism)
    with pytest.raises(ValueError, match="whole filter"):
        rag.answer("near", tenant="alice", epsilon=40.0)
    ids, texts, emb, _ = _world()
    config = RagConfig(k=4, max_tokens=3, accounting="individual")
    with pytest.raises(ValueError, match="no per-document filters"):
        DPRag(
            ids, texts, emb, None, TinyLM(), payer=collection_payer(ledger, "other"), config=config
        )
    with pytest.raises(ValueError, match="needs a ledger"):
        DPRag(ids, texts, emb, None, TinyLM(), config=config)
    ledger.ensure_scope(Scope("*", "records", 10.0, 1e-5))  # a collection cap
    with pytest.raises(ValueError, match="collection cap"):
        rag.with_config(rag.config)


def test_a_failure_after_the_charge_releases_nothing(tmp_path, monkeypatch):
    rag, _, filters, _, rho = _rag(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("secret-3 leaked into a message")

    monkeypatch.setattr(rag, "_decode", broken)
    with pytest.raises(AnswerFailedError) as failed:
        rag.answer("near", tenant="alice", epsilon=1.0)
    assert "secret" not in str(failed.value) and failed.value.__context__ is None
    np.testing.assert_allclose(filters.losses("records", ["d0"]), [rho])  # charged as planned


def test_participation_coins_spread_the_payments(tmp_path):
    rag, _, filters, lm, rho = _rag(tmp_path, participation=0.5)
    paid = 0
    for _ in range(4):
        rag.answer("near", tenant="alice", epsilon=1.0)
        # the rows are exactly the documents whose coins came up (6 relevant, 4 rows)
        paid_now = round(sum(filters.recompute("records").values()) / rho)
        assert sum("secret-" in p for p in lm.seen[-1]) == min(paid_now - paid, 4)
        paid = paid_now
    assert 0 < paid < 4 * 6  # some relevant documents sat answers out (p = 1 - 2**-24)
    assert filters.verify("records") == 0
    with pytest.raises(ValueError, match="participation"):
        RagConfig(participation=0.0)


def _charge_alice(ledger):
    """A bare charge (epsilon 1, no documents named) to alice's records."""
    from synthgen.privacy import accounting

    event = accounting.pure_epsilon_event(1.0)
    ledger.charge("alice", "records", stage="rag-tokens", event=event, relation="ADD_OR_REMOVE_ONE")


def test_filters_are_not_opened_over_earlier_collection_answers(tmp_path):
    from retriever.rag.collection import open_document_filters
    from retriever.rag.config import plan_answer

    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.ensure_scope(Scope("alice", "records", 5.0, 1e-5))
    _charge_alice(ledger)
    plan = plan_answer(RagConfig(max_tokens=3, accounting="individual"), "icl", 1.0)
    with pytest.raises(ValueError, match="already has charges"):
        open_document_filters(ledger, "records", documents=N, epsilon=4.0, delta=1e-6, plan=plan)
    assert DocumentFilters(ledger.store).get("records") is None
    open_document_filters(ledger, "fresh", documents=N, epsilon=4.0, delta=1e-6, plan=plan)


def test_the_same_records_under_new_ids_do_not_get_fresh_filters(tmp_path):
    """Filters are kept by document id: re-admitting the collection's records under other
    ids (or other records under its ids) is refused before anything is written, so an
    exhausted record never restarts at zero; the same ids and records again go on."""
    from retriever.rag.collection import PrivateCollection, open_document_filters
    from retriever.rag.config import plan_answer

    ids, texts, _, _ = _world()
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    plan = plan_answer(RagConfig(max_tokens=3, accounting="individual"), "icl", 1.0)
    tenant, target = Scope("alice", "records", 5.0, 1e-5), (4.0, 1e-6)

    def admit(doc_ids, records):
        collection = PrivateCollection.of("records", records, doc_ids=doc_ids)
        collection.admit(ledger, tenant, plan, document_target=target)

    admit(ids, texts)
    pinned = DocumentFilters(ledger.store).get("records").records
    assert re.fullmatch(r"[0-9a-f]{16}:[0-9a-f]{64}", pinned)  # a key id and a keyed digest
    admit(list(reversed(ids)), list(reversed(texts)))  # the same pairs, another order
    renumbered = [f"b{i}" for i in range(N)]
    edited = [*texts[:-1], "another record"]
    for doc_ids, records in ((renumbered, texts), (ids, edited), (ids[::-1], texts)):
        with pytest.raises(ValueError, match="ids name other records"):
            admit(doc_ids, records)
    assert DocumentFilters(ledger.store).get("records").records == pinned
    with pytest.raises(ValueError, match="name its records"):  # a caller naming none
        open_document_filters(ledger, "records", documents=N, epsilon=4.0, delta=1e-6, plan=plan)
    with ledger.store.write() as conn:  # filters opened before schema 11 pin nothing
        conn.execute("UPDATE document_filters SET records = NULL")
    admit(ids, texts)  # ... until their next admission pins them
    assert DocumentFilters(ledger.store).get("records").records == pinned


def test_a_collection_with_filters_refuses_collection_answers_and_bare_charges(tmp_path):
    rag, ledger, _, _, _ = _rag(tmp_path)
    with pytest.raises(ValueError, match="individual accounting"):
        rag.with_config(RagConfig(k=4, max_tokens=3))  # collection accounting
    with pytest.raises(ValueError, match="must name the documents"):
        _charge_alice(ledger)
    assert ledger.charges("alice", "records") == []


def test_the_decode_deadline_starts_after_the_charge_whatever_the_payers(tmp_path, monkeypatch):
    """The charge's time grows with its payers; the decode's deadline must not see it
    (issue 51): a fake clock that the charge advances by 1 s per payer gives the same
    `truncated` and token count for six payers ("near") and none ("far")."""
    import time

    rag, *_ = _rag(tmp_path)
    now = [1000.0]

    def clock():
        now[0] += 0.01  # every reading costs a little: decoding takes time
        return now[0]

    monkeypatch.setattr(time, "monotonic", clock)
    charge = rag._charge

    def slow_charge(*args, documents, **kwargs):
        def counted(conn):
            payers, rho = documents(conn)
            now[0] += 1.0 * len(payers)
            return payers, rho

        return charge(*args, documents=counted, **kwargs)

    monkeypatch.setattr(rag, "_charge", slow_charge)
    answers = {}
    for question in ("near", "far"):
        paid = now[0]
        answers[question] = rag.answer(question, tenant="alice", epsilon=1.0, deadline=now[0] + 3.0)
        answers[question + " charge"] = now[0] - paid
    assert answers["near charge"] > 6.0 > answers["far charge"]  # six payers were charged
    assert answers["near"].truncated == answers["far"].truncated == False  # noqa: E712
    assert answers["near"].tokens == answers["far"].tokens


def test_an_answer_states_one_rounded_up_figure(tmp_path):
    """The JSON's `*_text` figures are the ledger's rounding (`synthgen.privacy.figures`):
    the total and each stage rounded up, the remainder down (issue 51: 2.0003 / 1.9988 /
    1.999 for one answer before)."""
    from decimal import Decimal

    from synthgen.privacy import format_epsilon, format_left

    rag, *_ = _rag(tmp_path, epsilon=2.0)
    shown = rag.answer("near", tenant="alice", epsilon=2.0).to_json()
    assert shown["epsilon_text"] == format_epsilon(shown["epsilon"])
    assert Decimal(shown["epsilon_text"]) >= Decimal(repr(shown["epsilon"]))
    assert Decimal(shown["remaining_epsilon_text"]) <= Decimal(repr(shown["remaining_epsilon"]))
    assert shown["remaining_epsilon_text"] == format_left(shown["remaining_epsilon"])
    for charge in shown["charges"]:
        assert charge["epsilon_text"] == format_epsilon(charge["epsilon"])
    assert format_left(-0.1) == "0.0000" and format_left(1.23456) == "1.2345"

"""Tenants and `/budget` of a collection in individual (per-document) accounting, in process:
quotas without a collection cap, what the registry and the service refuse, and a budget that
states the document summary and no document's own figure."""

import numpy as np
import pytest
from fastapi.testclient import TestClient

from dpsynth.service.app import Service, ServiceConfig, create_app
from dpsynth.service.tenants import TenantRegistry
from retriever.rag.config import RagConfig, plan_answer
from retriever.rag.retrieval import ScoreRange
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope
from synthgen.privacy.document_filters import SUMMARY_KEYS, DocumentFilter, DocumentFilters
from synthgen.privacy.individual import DocumentBudget
from tests.dpsynth.service.harness import N_RECORDS, bearer, serve_in_thread, tiny_rag

INDIVIDUAL = {"accounting": "individual", "relevance_threshold": 0.5, "max_tokens": 2}


def _filters(ledger, dataset="records", documents=N_RECORDS):
    config = RagConfig(k=4, score_range=ScoreRange(-1.0, 1.0), **INDIVIDUAL)
    rho = plan_answer(config, "icl", 1.0).document_rho()
    record = DocumentFilter(dataset, DocumentBudget(3.0, 1e-5), rho, documents)
    return DocumentFilters(ledger.store).open(record)


def _alice_service(registry, **config):
    """alice (epsilon 50) and an icl `Service` over `tiny_rag`'s records in individual
    accounting: (the records' filter, alice's key, the rag, the service)."""
    record = _filters(registry.ledger)
    key = registry.add("alice", "records", epsilon=50.0, delta=1e-5)
    rag = tiny_rag(registry.ledger, "records", score_range=ScoreRange(-1.0, 1.0), **INDIVIDUAL)
    service = Service(
        registry.ledger, registry, "records", [rag], config=ServiceConfig(mechanism="icl", **config)
    )
    return record, key, rag, service


@pytest.fixture
def registry(tmp_path):
    return TenantRegistry(PrivacyLedger(tmp_path / "ledger.sqlite"))


def test_a_quota_needs_no_collection_cap_when_the_operator_says_so(registry):
    ledger = registry.ledger
    with pytest.raises(ValueError, match="no collection cap"):  # as before: no cap, no flag
        registry.add("alice", "records", epsilon=5.0, delta=1e-5)
    key = registry.add("alice", "records", epsilon=5.0, delta=1e-5, individual=True)
    assert registry.authenticate(key).name == "alice"
    assert ledger.collection_scope("records") is None  # no cap was opened
    assert ledger.get_scope("alice", "records").accountant == "rdp"  # a quota
    with pytest.raises(ValueError, match="takes no collection cap"):
        registry.add("bob", "records", epsilon=1.0, delta=1e-5, individual=True,
                     collection_epsilon=4.0, collection_delta=1e-5)  # fmt: skip
    assert [t.name for t in registry.tenants()] == ["alice"]


def test_filters_in_the_ledger_make_every_tenant_a_quota(registry):
    ledger = registry.ledger
    _filters(ledger)
    registry.add("alice", "records", epsilon=5.0, delta=1e-5)  # no flag needed
    assert ledger.get_scope("alice", "records").accountant == "rdp"
    registry.add("bob", "records", epsilon=5.0, delta=1e-5, accountant="pld")
    assert ledger.get_scope("bob", "records").accountant == "pld"
    with pytest.raises(ValueError, match="takes no collection cap"):
        registry.add("carol", "records", epsilon=1.0, delta=1e-5, collection_epsilon=4.0,
                     collection_delta=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match=rf"n={N_RECORDS} documents"):
        registry.add("dave", "records", epsilon=1.0, delta=0.1)
    assert ledger.collection_scope("records") is None
    assert [t.name for t in registry.tenants()] == ["alice", "bob"]


def test_a_collection_with_a_cap_refuses_a_quota(registry):
    registry.add("alice", "records", epsilon=1.0, delta=1e-5, collection_epsilon=4.0,
                 collection_delta=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="has a collection cap"):
        registry.add("bob", "records", epsilon=1.0, delta=1e-5, individual=True)


def test_budget_states_the_summary_and_no_document(registry):
    ledger = registry.ledger
    record, key, rag, service = _alice_service(registry, share_document_summary=True)
    with TestClient(create_app(service)) as client:
        for _ in range(2 * record.answers_per_document):  # the best documents run out
            assert client.post("/answer", headers=bearer(key), json={"question": "q"}).is_success
        response = client.get("/budget", headers=bearer(key))
        health = client.get("/health", headers=bearer(key)).json()
    budget = response.json()
    assert budget["accounting"] == "individual" and health["accounting"] == "individual"
    assert tuple(budget["documents"]) == SUMMARY_KEYS
    summary = DocumentFilters(ledger.store).summary("records")
    assert budget["documents"] == pytest.approx(summary) and summary["exhausted"] >= 1
    assert not any(f'"d{i}"' in response.text for i in range(N_RECORDS))  # no document id
    assert budget["num_charges"] == len(ledger.charges("alice", "records"))
    losses = DocumentFilters(ledger.store).losses("records", rag.doc_ids)
    assert np.all(losses <= record.budget.rho_cap * (1 + 1e-12))


def test_by_default_tenants_see_the_public_target_only(registry):
    ledger = registry.ledger
    record, key, _, service = _alice_service(registry)
    with TestClient(create_app(service)) as client:
        for _ in range(2 * record.answers_per_document):  # some documents are exhausted
            assert client.post("/answer", headers=bearer(key), json={"question": "q"}).is_success
        budget = client.get("/budget", headers=bearer(key)).json()
    assert DocumentFilters(ledger.store).summary("records")["exhausted"] >= 1
    assert budget["documents"] == {
        "documents": N_RECORDS,
        "epsilon": record.budget.epsilon,
        "delta": record.budget.delta,
        "shared": False,
    }


def test_a_collection_mode_budget_says_so(registry):
    key = registry.add("alice", "records", epsilon=1.0, delta=1e-5, collection_epsilon=4.0,
                       collection_delta=1e-5)  # fmt: skip
    service = Service(registry.ledger, registry, "records", [])
    with TestClient(create_app(service)) as client:
        budget = client.get("/budget", headers=bearer(key)).json()
    assert budget["accounting"] == "collection" and "documents" not in budget


def test_the_service_refuses_what_individual_accounting_cannot_serve(registry):
    ledger = registry.ledger
    _filters(ledger)
    registry.add("alice", "records", epsilon=5.0, delta=1e-5)
    rag = tiny_rag(ledger, "records", score_range=ScoreRange(-1.0, 1.0), **INDIVIDUAL)
    with pytest.raises(ValueError, match="icl only"):
        Service(ledger, registry, "records", [rag], config=ServiceConfig(mechanism="keywords"))
    ledger.ensure_scope(Scope(COLLECTION, "records", 10.0, 1e-5))  # a cap appears
    with pytest.raises(ValueError, match="has a collection cap"):
        Service(ledger, registry, "records", [rag], config=ServiceConfig(mechanism="icl"))


def test_the_page_shows_the_document_summary(chromium, registry):
    ledger = registry.ledger
    record, key, _, service = _alice_service(registry, share_document_summary=True)
    with serve_in_thread(service) as url:
        page = chromium.new_page()
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url + "/")
        page.fill("#key", key)
        page.dispatch_event("#key", "change")
        page.wait_for_function("!document.getElementById('documents').hidden")
        assert "0 of 16 documents exhausted" in page.locator("#documents").inner_text()
        for _ in range(2 * record.answers_per_document):
            page.fill("#question", "q")
            page.click("#ask")
            page.wait_for_function("!document.body.dataset.busy")
        shown = page.locator("#documents").inner_text()
        summary = DocumentFilters(ledger.store).summary("records")
        assert f"{summary['exhausted']} of 16 documents exhausted" in shown
        assert summary["exhausted"] >= 1 and "quota" in shown
        assert page.locator("#error").inner_text() == "" and not errors
        page.close()


def test_a_quota_that_cannot_compose_the_answers_is_refused_with_its_remedy(registry):
    """Bounded-range icl tokens are an (epsilon, delta) event, which an rdp quota cannot
    compose: the server refuses to start, and a tenant added after the start gets a 409
    (not a 500) saying what the operator does."""
    ledger = registry.ledger
    _filters(ledger)
    rag = tiny_rag(ledger, "records", composition="bounded-range", **INDIVIDUAL)
    config = ServiceConfig(mechanism="icl")
    registry.add("alice", "records", epsilon=50.0, delta=1e-5)  # rdp: the quota default
    with pytest.raises(ValueError, match="cannot account for .* --accountant pld or basic"):
        Service(ledger, registry, "records", [rag], config=config)
    registry.revoke("alice")
    ok = registry.add("bob", "records", epsilon=50.0, delta=1e-5, accountant="basic")
    service = Service(ledger, registry, "records", [rag], config=config)
    late = registry.add("carol", "records", epsilon=50.0, delta=1e-5)  # rdp, after start
    with TestClient(create_app(service)) as client:
        assert client.post("/answer", headers=bearer(ok), json={"question": "q"}).is_success
        refused = client.post("/answer", headers=bearer(late), json={"question": "q"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "accountant_cannot_compose"
    assert "--accountant pld or basic" in refused.json()["detail"]


def test_a_repeated_question_is_answered_again_for_free(registry):
    """--reuse-answers tenant through the HTTP API: the second ask returns the first
    release, marked reused, with nothing charged to the tenant or any document."""
    import numpy as np

    from retriever.rag.reuse import ReleasedAnswers

    ledger = registry.ledger
    _filters(ledger)
    key = registry.add("alice", "records", epsilon=50.0, delta=1e-5)
    rag = tiny_rag(ledger, "records", score_range=ScoreRange(-1.0, 1.0), **INDIVIDUAL)
    # seed 2: a first answer that does not abstain (an abstention is not kept)
    rag._rng, rag.answers = np.random.default_rng(2), ReleasedAnswers("tenant")
    service = Service(ledger, registry, "records", [rag], config=ServiceConfig(mechanism="icl"))
    filters = DocumentFilters(ledger.store)
    with TestClient(create_app(service)) as client:
        first = client.post("/answer", headers=bearer(key), json={"question": "Blue?"}).json()
        charges = len(ledger.charges("alice", "records"))
        losses = filters.losses("records", rag.doc_ids).copy()
        again = client.post("/answer", headers=bearer(key), json={"question": "blue"}).json()
    assert not first["answer"]["abstained"] and not first["answer"]["reused"]
    assert again["answer"]["reused"] and again["answer"]["text"] == first["answer"]["text"]
    assert again["answer"]["charges"] == []
    assert len(ledger.charges("alice", "records")) == charges
    assert (filters.losses("records", rag.doc_ids) == losses).all()

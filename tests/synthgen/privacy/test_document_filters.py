"""Per-document filters in the ledger's store, on SQLite and on a real PostgreSQL server:
exhaustion, all-or-nothing charges, concurrent answers touching the same documents, the
summary, and the copy that refuses to drop them."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from synthgen.privacy.document_filters import (
    SUMMARY_KEYS,
    DocumentBudgetError,
    DocumentFilter,
    DocumentFilters,
)
from synthgen.privacy.individual import DocumentBudget, rho_epsilon
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_copy import copy_ledger

BUDGET = DocumentBudget(epsilon=2.0, delta=1e-6)
ANSWER_RHO = BUDGET.rho_cap / 5.5  # five answers fit, the sixth does not


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return request.getfixturevalue("postgres_url")


def _filters(location, documents=100):
    filters = DocumentFilters(PrivacyLedger(location).store)
    filters.open(DocumentFilter("records", BUDGET, ANSWER_RHO, documents))
    return filters


def test_open_is_once_and_validated(tmp_path):
    filters = _filters(str(tmp_path / "l.sqlite"))
    assert filters.open(DocumentFilter("records", BUDGET, ANSWER_RHO, 100)) is not None
    with pytest.raises(ValueError, match="never change"):
        filters.open(DocumentFilter("records", BUDGET, ANSWER_RHO / 2, 100))
    assert filters.get("other") is None
    with pytest.raises(ValueError, match="not one answer"):
        DocumentFilter("x", BUDGET, BUDGET.rho_cap * 1.01, 100)
    with pytest.raises(ValueError, match="below 1/documents"):
        DocumentFilter("x", BUDGET, ANSWER_RHO, 2_000_000)
    assert DocumentFilter("x", BUDGET, ANSWER_RHO, 100).answers_per_document == 5


def test_a_document_pays_until_its_cap_and_a_refused_charge_writes_nothing(location):
    filters = _filters(location)
    for _ in range(5):
        filters.charge("records", ["a", "b"], ANSWER_RHO)
    filters.charge("records", ["c"], ANSWER_RHO)
    with pytest.raises(DocumentBudgetError) as refused:
        filters.charge("records", ["a", "c", "d"], ANSWER_RHO)  # "a" is exhausted
    assert refused.value.refused == 1 and "'a'" not in str(refused.value)  # a count, no id
    np.testing.assert_allclose(
        filters.losses("records", ["a", "b", "c", "d"]),
        [5 * ANSWER_RHO, 5 * ANSWER_RHO, ANSWER_RHO, 0.0],
    )
    assert filters.active("records", ["a", "c", "d"], ANSWER_RHO).tolist() == [False, True, True]
    summary = filters.summary("records")
    assert tuple(summary) == SUMMARY_KEYS
    assert (summary["documents"], summary["active"], summary["exhausted"]) == (100, 98, 2)
    assert summary["max_epsilon"] == pytest.approx(rho_epsilon(5 * ANSWER_RHO, 1e-6))
    assert summary["max_epsilon"] <= BUDGET.epsilon
    assert summary["median_epsilon"] == 0.0 and summary["delta"] == 1e-6
    mean = (2 * rho_epsilon(5 * ANSWER_RHO, 1e-6) + rho_epsilon(ANSWER_RHO, 1e-6)) / 100
    assert summary["mean_epsilon"] == pytest.approx(mean)
    with pytest.raises(ValueError, match="once"):
        filters.charge("records", ["e", "e"], ANSWER_RHO)
    with pytest.raises(KeyError):
        filters.charge("unknown", ["e"], ANSWER_RHO)


def test_a_charge_rolls_back_with_the_callers_transaction(location):
    filters = _filters(location)
    store = PrivacyLedger(location).store
    with pytest.raises(RuntimeError), store.scope_lock("records") as conn:
        filters.charge_in(conn, "records", ["a"], ANSWER_RHO)
        raise RuntimeError("the answer's own charge was refused")
    assert filters.losses("records", ["a"]).tolist() == [0.0]


def test_concurrent_answers_never_push_a_document_past_its_cap(location):
    _filters(location, documents=20)
    rng = np.random.default_rng(3)
    plans = [[rng.choice(8, 3, replace=False).tolist() for _ in range(12)] for _ in range(6)]

    def answer_stream(plan):
        filters = DocumentFilters(PrivacyLedger(location).store)  # own connection
        paid = []
        for docs in plan:
            ids = [f"doc-{d}" for d in docs]
            try:
                filters.charge("records", ids, ANSWER_RHO)
                paid.extend(ids)
            except DocumentBudgetError:
                pass
        return paid

    with ThreadPoolExecutor(6) as pool:
        paid = [doc for stream in pool.map(answer_stream, plans) for doc in stream]
    ids = [f"doc-{d}" for d in range(8)]
    filters = DocumentFilters(PrivacyLedger(location).store)
    losses = filters.losses("records", ids)
    counts = np.array([paid.count(d) for d in ids])
    assert np.all(losses <= BUDGET.rho_cap)
    recomputed = filters.recompute("records")  # from the per-charge rows
    np.testing.assert_allclose([recomputed.get(d, 0.0) for d in ids], losses)
    assert filters.verify("records") == 0
    np.testing.assert_allclose(losses, counts * ANSWER_RHO)  # every accepted charge recorded
    assert counts.max() == 5  # the race did reach the cap (72 answers over 8 documents)


def test_copy_refuses_a_ledger_with_document_filters(tmp_path):
    source = str(tmp_path / "source.sqlite")
    _filters(source).charge("records", ["a"], ANSWER_RHO)
    with pytest.raises(ValueError, match="per-document"):
        copy_ledger(source, tmp_path / "target.sqlite")


def test_an_answers_charge_and_its_documents_land_together_or_not_at_all(location):
    from synthgen.privacy import accounting
    from synthgen.privacy.errors import BudgetExceededError
    from synthgen.privacy.ledger_types import Scope

    ledger = PrivacyLedger(location)
    ledger.open_scope(Scope("acme", "records", 1.0, 1e-5))
    filters = DocumentFilters(ledger.store)
    filters.open(DocumentFilter("records", BUDGET, ANSWER_RHO, 100))
    answer = [("tokens", accounting.pure_epsilon_event(0.4), "answer")]
    ar = "ADD_OR_REMOVE_ONE"
    ledger.charge_all("acme", "records", answer, relation=ar, documents=(["a", "b"], ANSWER_RHO))
    for _ in range(4):
        filters.charge("records", ["c"], ANSWER_RHO)
    filters.charge("records", ["c"], ANSWER_RHO)
    with pytest.raises(DocumentBudgetError):  # a document refuses: no charge row either
        ledger.charge_all(
            "acme", "records", answer, relation=ar, documents=(["a", "c"], ANSWER_RHO)
        )
    assert len(ledger.charges("acme", "records")) == 1
    ledger.charge_all("acme", "records", answer, relation=ar, documents=(["a"], ANSWER_RHO))
    with pytest.raises(BudgetExceededError):  # the tenant's quota refuses: no document pays
        ledger.charge_all("acme", "records", answer, relation=ar, documents=(["b"], ANSWER_RHO))
    np.testing.assert_allclose(
        filters.losses("records", ["a", "b", "c"]), [2 * ANSWER_RHO, ANSWER_RHO, 5 * ANSWER_RHO]
    )

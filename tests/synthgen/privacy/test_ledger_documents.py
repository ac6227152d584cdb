"""A ledger knows the documents behind each collection name (`ledger_documents`): a new name
over documents another name has charged is refused unless the guarantees are meant to add
up, and names over the same documents are grouped with their composed total."""

import hashlib

import pytest
from dp_accounting import dp_event, pld

from synthgen.privacy.errors import BudgetExceededError
from synthgen.privacy.events import EpsilonDeltaDpEvent
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_copy import copy_ledger
from synthgen.privacy.ledger_documents import (
    DocumentGroup,
    SharedDocumentsError,
    bind_texts,
    documents_fingerprint,
)
from synthgen.privacy.ledger_types import Scope

AR = "ADD_OR_REMOVE_ONE"
TEXTS = ["the first record", "the second record", "a third one"]


def _charge(ledger, dataset, sigma=2.0, tenant="t"):
    ledger.ensure_scope(Scope(tenant, dataset, 50.0, 1e-6))
    ledger.charge(tenant, dataset, stage="s", relation=AR, event=dp_event.GaussianDpEvent(sigma))


def test_the_fingerprint_is_of_the_documents_not_their_order_or_file():
    assert documents_fingerprint(TEXTS) == documents_fingerprint(TEXTS[::-1])
    assert documents_fingerprint(TEXTS) != documents_fingerprint(TEXTS[:2])
    assert documents_fingerprint(TEXTS) != documents_fingerprint(TEXTS + TEXTS[:1])
    assert documents_fingerprint(TEXTS) != documents_fingerprint(["x" + TEXTS[0], *TEXTS[1:]])
    with pytest.raises(ValueError, match="at least one document"):
        documents_fingerprint([])


def test_a_new_name_over_charged_documents_needs_the_flag(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    assert bind_texts(ledger, "records", TEXTS) == []
    assert bind_texts(ledger, "records", TEXTS[::-1]) == []  # the same binding: a no-op
    # a name bound but never charged has spent nothing another name would add to
    assert bind_texts(ledger, "records-b", TEXTS) == ["records"]
    _charge(ledger, "records")
    with pytest.raises(SharedDocumentsError, match="records") as refused:
        bind_texts(ledger, "records-v2", TEXTS)
    message = str(refused.value)
    assert "--dataset records" in message and "--guarantees-add-up" in message
    assert not _private_state(ledger) & set(message.split())  # no secret, no digest in it
    assert ledger.document_groups()[0].datasets == ("records", "records-b")  # nothing written
    assert bind_texts(ledger, "records-v2", TEXTS, guarantees_add_up=True) == [
        "records",
        "records-b",
    ]
    # other documents: no refusal
    assert bind_texts(ledger, "other", ["something else"]) == []


def test_groups_compose_every_charge_of_every_name(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    for name in ("a", "b", "c"):
        bind_texts(ledger, name, TEXTS, guarantees_add_up=True)
        _charge(ledger, name, sigma=2.0)
    bind_texts(ledger, "alone", ["x"])
    _charge(ledger, "alone")
    (group,) = ledger.document_groups()
    assert group.datasets == ("a", "b", "c") and group.documents == 3
    assert group.delta == pytest.approx(3e-6)  # the sum of the names' delta caps
    # three Gaussians of sigma 2 (sensitivity 1) are one of sigma 2/sqrt(3)
    exact = pld.privacy_loss_distribution.from_gaussian_mechanism(
        2.0 / 3**0.5, value_discretization_interval=1e-4
    ).get_epsilon_for_delta(3e-6)
    assert exact <= group.epsilon <= exact * 1.01
    each = ledger.spent("t", "a").epsilon
    assert group.epsilon > each  # more than any one name states
    row = group.to_json()
    assert row["same_documents"] == ["a", "b", "c"] and "fingerprint" not in str(row)
    assert all("alone" not in g.datasets for g in ledger.document_groups())


def test_names_sharing_documents_through_a_third_are_one_group(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "old", TEXTS)
    bind_texts(ledger, "both", TEXTS)  # a name whose collection changed: two fingerprints
    bind_texts(ledger, "both", TEXTS + ["new"])
    bind_texts(ledger, "new", TEXTS + ["new"])
    (group,) = ledger.document_groups()
    assert set(group.datasets) == {"old", "both", "new"} and group.documents == 4
    assert group.epsilon == 0.0  # nothing charged yet


def test_a_copy_keeps_which_names_share_documents(tmp_path):
    source = PrivacyLedger(tmp_path / "a.db")
    for name in ("a", "b"):
        bind_texts(source, name, TEXTS, guarantees_add_up=True)
        _charge(source, name)
    copy_ledger(tmp_path / "a.db", tmp_path / "b.db")
    target = PrivacyLedger(tmp_path / "b.db")
    assert [g.datasets for g in target.document_groups()] == [("a", "b")]
    with pytest.raises(SharedDocumentsError):
        bind_texts(target, "c", TEXTS)


def test_a_copy_keeps_which_sharing_was_admitted_deliberately(tmp_path):
    """Two names bound before either charged, the later one with --guarantees-add-up: its
    charges go through in the source, and must in the copy too."""
    source = PrivacyLedger(tmp_path / "a.db")
    bind_texts(source, "a", TEXTS)
    bind_texts(source, "b", TEXTS, guarantees_add_up=True)
    _charge(source, "a")
    _charge(source, "b")
    copy_ledger(tmp_path / "a.db", tmp_path / "b.db")
    target = PrivacyLedger(tmp_path / "b.db")
    target.charge("t", "b", stage="s", relation=AR, event=dp_event.GaussianDpEvent(2.0))
    assert len(target.charges("t", "b")) == 2


def test_a_binding_left_by_a_refused_run_admits_no_new_name(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "stale", TEXTS)  # bound, then the run was refused: nothing charged
    bind_texts(ledger, "records", TEXTS)
    _charge(ledger, "records")
    with pytest.raises(SharedDocumentsError, match="records"):
        bind_texts(ledger, "stale", TEXTS)
    assert bind_texts(ledger, "stale", TEXTS, guarantees_add_up=True) == ["records"]


def test_a_group_total_never_understates_mixed_relations_and_filters(tmp_path):
    from synthgen.privacy.document_filters import DocumentFilter, DocumentFilters
    from synthgen.privacy.individual import DocumentBudget

    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "answers", TEXTS)
    filters = DocumentFilters(ledger.store)
    filters.open(DocumentFilter("answers", DocumentBudget(2.0, 1e-6), 0.01, len(TEXTS)))
    bind_texts(ledger, "replace", TEXTS, guarantees_add_up=True)
    ledger.ensure_scope(Scope("t", "replace", 50.0, 1e-6, relation="REPLACE_ONE"))
    ledger.charge("t", "replace", stage="s", relation="REPLACE_ONE",
                  event=dp_event.LaplaceDpEvent(1.0))  # fmt: skip
    (group,) = ledger.document_groups()
    # in replace-one the filter's (2, 1e-6) counts as (4, ...), and the Laplace adds on
    assert group.epsilon > max(4.0, ledger.spent("t", "replace").epsilon)
    assert group.delta == pytest.approx(1e-6 + 1e-6)


def test_a_copy_keeps_bindings_never_charged(tmp_path):
    source = PrivacyLedger(tmp_path / "a.db")
    bind_texts(source, "charged", TEXTS)
    _charge(source, "charged")
    bind_texts(source, "bound-only", TEXTS, guarantees_add_up=True)
    copy_ledger(tmp_path / "a.db", tmp_path / "b.db")
    target = PrivacyLedger(tmp_path / "b.db")
    assert [g.datasets for g in target.document_groups()] == [("charged", "bound-only")]


def _collection(n=30):
    return [f"ticket {i}: the printer on floor {i % 7} jams" for i in range(n)]


@pytest.mark.parametrize(
    "change",
    [
        lambda texts: [*texts, "one more ticket"],  # appended
        lambda texts: texts[1:],  # one removed (or a dedupe)
        lambda texts: [texts[0] + " (edited)", *texts[1:]],  # one edited
        lambda texts: [t.upper() for t in texts[:-1]] + texts[-1:],  # all but one rewritten
    ],
    ids=["added", "removed", "edited", "one-shared"],
)
def test_a_collection_that_differs_by_records_is_refused_and_grouped(tmp_path, change):
    ledger = PrivacyLedger(tmp_path / "l.db")
    texts = _collection()
    bind_texts(ledger, "tickets", texts)
    _charge(ledger, "tickets")
    with pytest.raises(SharedDocumentsError, match="tickets") as refused:
        bind_texts(ledger, "tickets-v2", change(texts))
    assert "--dataset tickets" in str(refused.value)  # the same collection: keep one budget
    assert ledger.document_groups() == []  # nothing written
    assert bind_texts(ledger, "tickets-v2", change(texts), guarantees_add_up=True) == ["tickets"]
    _charge(ledger, "tickets-v2")
    (group,) = ledger.document_groups()
    assert group.datasets == ("tickets", "tickets-v2")
    assert group.epsilon > ledger.spent("t", "tickets").epsilon
    # the same name over its grown collection needs no flag, and stays one group
    assert bind_texts(ledger, "tickets", [*texts, "a new ticket"]) == ["tickets-v2"]
    assert bind_texts(ledger, "elsewhere", ["nothing shared"]) == []


def test_the_ledger_keeps_keyed_record_digests_only(tmp_path):
    import sqlite3

    texts = _collection(5)
    tables = []
    for name in ("a.db", "b.db"):
        ledger = PrivacyLedger(tmp_path / name)
        bind_texts(ledger, "tickets", texts)
        with sqlite3.connect(tmp_path / name) as conn:
            tables.append(
                {
                    "records": {r[0] for r in conn.execute("SELECT digest FROM document_records")},
                    "sets": [r[0] for r in conn.execute("SELECT fingerprint FROM document_sets")],
                }
            )
    assert len(tables[0]["records"]) == 5
    assert not tables[0]["records"] & tables[1]["records"]  # another ledger, another key
    unkeyed = {hashlib.sha256(t.encode()).hexdigest() for t in texts}
    for table in tables:
        assert not {d for d in table["records"] if any(u.startswith(d) for u in unkeyed)}
        assert documents_fingerprint(texts) not in table["sets"]
    assert (tmp_path / "a.db").stat().st_mode & 0o777 == 0o600  # the operator's only


def test_a_binding_takes_one_constant_lock(tmp_path, monkeypatch):
    ledger = PrivacyLedger(tmp_path / "l.db")
    taken = []
    original = ledger.store.scope_lock
    monkeypatch.setattr(
        ledger.store, "scope_lock", lambda name, *a: taken.append(name) or original(name, *a)
    )
    bind_texts(ledger, "a", ["one text"])
    bind_texts(ledger, "b", ["another text entirely"])
    assert len(set(taken)) == 1  # nothing derived from the records names a lock
    assert not any(p in taken[0] for p in _private_state(ledger))


def test_a_ledger_before_schema_10_still_refuses_its_whole_collections(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    with ledger.store.write() as conn:  # what schema 9 wrote: the unkeyed whole digest
        conn.execute(
            "INSERT INTO document_sets (dataset, fingerprint, documents, created_at) "
            "VALUES (?, ?, ?, ?)",
            ("old", documents_fingerprint(TEXTS), len(TEXTS), 0.0),
        )
    _charge(ledger, "old")
    with pytest.raises(SharedDocumentsError, match="old"):
        bind_texts(ledger, "new", TEXTS)
    bind_texts(ledger, "new", TEXTS, guarantees_add_up=True)
    assert [g.datasets for g in ledger.document_groups()] == [("old", "new")]


def test_a_group_never_states_less_than_one_of_its_names(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "strict", TEXTS)
    ledger.ensure_scope(Scope("t", "strict", 50.0, 1e-6))
    ledger.charge("t", "strict", stage="s", relation=AR, event=dp_event.GaussianDpEvent(1.0))
    bind_texts(ledger, "loose", TEXTS, guarantees_add_up=True)
    ledger.ensure_scope(Scope("t", "loose", 50.0, 1e-5))  # a larger delta cap, nothing spent
    (group,) = ledger.document_groups()
    assert group.delta == pytest.approx(1.1e-5)
    # at the group's larger delta the Gaussian alone states less than "strict" does at 1e-6
    assert group.epsilon >= ledger.spent("t", "strict").epsilon


def test_an_infinite_group_total_says_why(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "facts", TEXTS)
    ledger.ensure_scope(Scope("t", "facts", 50.0, 1e-6))
    ledger.charge("t", "facts", stage="knowledge-release", relation=AR,
                  event=EpsilonDeltaDpEvent(10.0, 1e-6))  # fmt: skip
    bind_texts(ledger, "replace", TEXTS, guarantees_add_up=True)
    ledger.ensure_scope(Scope("t", "replace", 50.0, 1e-6, relation="REPLACE_ONE"))
    ledger.charge("t", "replace", stage="s", relation="REPLACE_ONE",
                  event=dp_event.LaplaceDpEvent(1.0))  # fmt: skip
    (group,) = ledger.document_groups()
    assert group.epsilon == float("inf")
    line = group.to_json()["line"]
    assert "mix relations" in line and "replace" in line and "facts" in line
    assert "1 + e^epsilon" in line


def _private_state(ledger) -> set[str]:
    """The ledger's secrets and record digests (what must never leave it)."""
    with ledger.store.read() as conn:
        keys = {r[0] for r in conn.execute("SELECT secret FROM ledger_keys").fetchall()}
        digests = {r[0] for r in conn.execute("SELECT digest FROM document_records").fetchall()}
    assert keys and digests
    return keys | digests


def test_two_names_bound_before_either_charged_cannot_both_charge(tmp_path):
    """A service bound to a collection that has not answered yet, and a second name over
    the same records bound meanwhile: the second to charge is refused, then and later."""
    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "a", TEXTS)
    assert bind_texts(ledger, "b", [*TEXTS, "one more"]) == ["a"]  # a has spent nothing yet
    _charge(ledger, "a")
    with pytest.raises(BudgetExceededError, match="share records with a") as refused:
        _charge(ledger, "b")
    assert "--guarantees-add-up" in str(refused.value) and ledger.charges("t", "b") == []
    with pytest.raises(SharedDocumentsError, match="a"):  # b's next run is refused at binding
        bind_texts(ledger, "b", [*TEXTS, "one more"])
    _charge(ledger, "a")  # a keeps its own budget
    bind_texts(ledger, "b", [*TEXTS, "one more"], guarantees_add_up=True)  # deliberately
    _charge(ledger, "b")
    assert bind_texts(ledger, "b", [*TEXTS, "one more"]) == ["a"]  # admitted for good
    (group,) = ledger.document_groups()
    assert group.datasets == ("a", "b")


def test_names_bound_before_schema_10_refuse_a_collection_they_cannot_compare(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    with ledger.store.write() as conn:  # schema 9: only the whole collection's digest
        conn.execute(
            "INSERT INTO document_sets (dataset, fingerprint, documents, created_at) "
            "VALUES (?, ?, ?, ?)",
            ("old", documents_fingerprint(TEXTS), len(TEXTS), 0.0),
        )
    _charge(ledger, "old")
    with pytest.raises(SharedDocumentsError, match="before schema 10") as refused:
        bind_texts(ledger, "new", [*TEXTS, "one more"])  # a record added: not equal
    assert "old" in str(refused.value)
    assert bind_texts(ledger, "old", TEXTS) == []  # old's next run binds its records
    with pytest.raises(SharedDocumentsError, match="--dataset old"):
        bind_texts(ledger, "new", [*TEXTS, "one more"])  # now compared record by record


def test_an_existing_ledger_file_is_made_private(tmp_path):
    import os

    path = tmp_path / "shared.db"
    PrivacyLedger(path)
    os.chmod(path, 0o644)  # a ledger made before ledger files were private
    bind_texts(PrivacyLedger(path), "records", TEXTS)
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_basic_name_with_replace_one_charges_is_summed_in_replace_one(tmp_path):
    ledger = PrivacyLedger(tmp_path / "l.db")
    bind_texts(ledger, "x", TEXTS)
    ledger.ensure_scope(Scope("t1", "x", 50.0, 1e-6, accountant="basic"))
    ledger.charge("t1", "x", stage="s", relation=AR, event=dp_event.LaplaceDpEvent(1.0),
                  delta=1e-7)  # fmt: skip
    ledger.ensure_scope(Scope("t2", "x", 50.0, 1e-6, relation="REPLACE_ONE"))
    ledger.charge("t2", "x", stage="s", relation="REPLACE_ONE",
                  event=dp_event.LaplaceDpEvent(1.0))  # fmt: skip
    bind_texts(ledger, "y", TEXTS, guarantees_add_up=True)
    _charge(ledger, "y")
    (group,) = ledger.document_groups()
    # on replace-one: Laplace(1) add/remove is 2, the replace-one Laplace 1, the basic
    # scope's add/remove charge 2 more: at least 5 with y's Gaussian on top
    assert group.epsilon >= 5.0


def test_an_infinite_total_is_valid_json(tmp_path):
    import json

    group = DocumentGroup(("a", "b"), 3, float("inf"), 1e-6, "why")
    row = json.loads(json.dumps(group.to_json(), allow_nan=False))
    assert row["epsilon_spent"] is None and row["epsilon_spent_text"] == "inf"

"""Collection caps: one cap over every tenant of a dataset, checked in the charge's
transaction, on SQLite and PostgreSQL, from threads and processes."""

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from synthgen.privacy import COLLECTION, BudgetExceededError, PrivacyLedger, Scope, accounting
from tests.synthgen.privacy.ledger_workers import charge_until_refused, race_processes

AR = "ADD_OR_REMOVE_ONE"
TENANTS = ("alice", "bob", "carol")


def _pure(eps):
    return accounting.pure_epsilon_event(eps)


def _ledger(location, *, tenants=("alice", "bob", "carol"), tenant_cap=1.0, collection_cap=1.0):
    book = PrivacyLedger(location)
    for name in tenants:
        book.open_scope(Scope(name, "records", tenant_cap, 1e-5))
    if collection_cap is not None:
        book.open_scope(Scope(COLLECTION, "records", collection_cap, 1e-5))
    return book


def test_collection_cap_binds_across_tenants(tmp_path):
    book = _ledger(tmp_path / "l.sqlite", collection_cap=1.0)
    book.charge("alice", "records", stage="a", event=_pure(0.6), relation=AR)
    with pytest.raises(BudgetExceededError, match="collection cap") as refused:
        book.charge("bob", "records", stage="a", event=_pure(0.6), relation=AR)
    assert refused.value.tenant == COLLECTION and refused.value.dataset == "records"
    assert book.charges("bob", "records") == []  # the refusal recorded nothing
    with pytest.raises(BudgetExceededError, match="collection cap"):
        book.check("bob", "records", stage="a", event=_pure(0.6), relation=AR)
    book.charge("bob", "records", stage="a", event=_pure(0.4), relation=AR)
    assert book.spent(COLLECTION, "records").epsilon == pytest.approx(1.0, rel=1e-3)
    assert book.spent("alice", "records").epsilon == pytest.approx(0.6, rel=1e-3)
    assert book.spent("bob", "records").epsilon == pytest.approx(0.4, rel=1e-3)
    # the collection's history is every tenant's charges, recorded once
    assert [c.tenant for c in book.charges(COLLECTION, "records")] == ["alice", "bob"]
    check = book.verify(COLLECTION, "records")
    assert check.num_charges == 2 and check.best <= check.stated * (1 + 1e-9)


def test_tenant_cap_still_binds_below_the_collection_cap(tmp_path):
    book = _ledger(tmp_path / "l.sqlite", tenant_cap=0.5, collection_cap=10.0)
    with pytest.raises(BudgetExceededError, match=r"\(alice, records\)") as refused:
        book.charge("alice", "records", stage="a", event=_pure(0.6), relation=AR)
    assert refused.value.tenant == "alice"
    assert book.spent(COLLECTION, "records").num_charges == 0


def test_a_new_ledger_object_and_a_late_collection_scope_count_every_charge(tmp_path):
    path = tmp_path / "l.sqlite"
    book = _ledger(path, collection_cap=None)
    book.charge("alice", "records", stage="a", event=_pure(0.5), relation=AR)
    book.charge("bob", "records", stage="a", event=_pure(0.3), relation=AR)
    # opened after the fact, the collection scope composes what was already spent
    book.open_scope(Scope(COLLECTION, "records", 1.0, 1e-5))
    other = PrivacyLedger(path)
    assert other.spent(COLLECTION, "records").epsilon == pytest.approx(0.8, rel=1e-3)
    with pytest.raises(BudgetExceededError):
        other.charge("carol", "records", stage="a", event=_pure(0.3), relation=AR)
    # the first object's cached collection summary catches up with the other's charge
    other.charge("carol", "records", stage="a", event=_pure(0.1), relation=AR)
    with pytest.raises(BudgetExceededError):
        book.charge("alice", "records", stage="a", event=_pure(0.15), relation=AR)


def test_idempotent_retry_is_not_counted_twice(tmp_path):
    book = _ledger(tmp_path / "l.sqlite", collection_cap=1.0)
    items = [("rag-retrieval", _pure(0.1), ""), ("rag-tokens", _pure(0.4), "")]
    first = book.charge_all("alice", "records", items, relation=AR, ref="r1")
    again = book.charge_all("alice", "records", items, relation=AR, ref="r1")
    assert first == again
    assert book.spent(COLLECTION, "records").epsilon == pytest.approx(0.5, rel=1e-3)


def test_collection_scopes_compose_events(tmp_path):
    with pytest.raises(ValueError, match="pld or rdp"):
        Scope(COLLECTION, "records", 1.0, 1e-5, accountant="basic")


def test_other_datasets_are_not_capped(tmp_path):
    book = _ledger(tmp_path / "l.sqlite", collection_cap=0.5)
    book.open_scope(Scope("alice", "other", 5.0, 1e-5))
    book.charge("alice", "other", stage="a", event=_pure(2.0), relation=AR)
    assert book.spent(COLLECTION, "records").num_charges == 0


def _collection_race(location, processes):
    """Three tenants x `processes` workers charge 0.25 ten times each; the collection cap
    1.0 admits exactly 4 of them in total whatever the interleaving."""
    _ledger(location, tenant_cap=1.0, collection_cap=1.0)
    workers = [
        partial(charge_until_refused, query="records", epsilon=0.25, tenant=TENANTS[i % 3])
        for i in range(processes)
    ]
    return sum(race_processes(location, workers))


def test_concurrent_tenants_never_pass_the_collection_cap_sqlite(tmp_path):
    location = str(tmp_path / "race.sqlite")
    assert _collection_race(location, 6) == 4
    book = PrivacyLedger(location)
    assert book.spent(COLLECTION, "records").epsilon == pytest.approx(1.0, rel=1e-3)


def test_concurrent_tenants_never_pass_the_collection_cap_postgres(postgres_url):
    assert _collection_race(postgres_url, 6) == 4
    book = PrivacyLedger(postgres_url)
    assert len(book.charges(COLLECTION, "records")) == 4
    check = book.verify(COLLECTION, "records")
    assert check.stated == pytest.approx(1.0, rel=1e-3) and check.best <= 1.0 + 1e-9


def test_threads_on_postgres_respect_both_caps(postgres_url):
    book = _ledger(postgres_url, tenant_cap=0.5, collection_cap=1.25)
    worker = partial(charge_until_refused, query="records", epsilon=0.25)
    with ThreadPoolExecutor(6) as pool:
        accepted = list(
            pool.map(
                lambda name: worker(postgres_url, tenant=name),
                ["alice", "bob", "carol"] * 2,
            )
        )
    assert sum(accepted) == 5  # the collection admits 5 of the 6 the tenant caps allow
    for name in ("alice", "bob", "carol"):
        assert book.spent(name, "records").epsilon <= 0.5 + 1e-9


def test_collection_caps_and_basic_scopes_do_not_mix(tmp_path):
    book = _ledger(tmp_path / "l.sqlite", collection_cap=1.0)
    with pytest.raises(ValueError, match="both a collection cap and basic"):
        book.open_scope(Scope("dave", "records", 1.0, 1e-5, accountant="basic"))
    other = _ledger(tmp_path / "m.sqlite", collection_cap=None)
    other.open_scope(Scope("dave", "records", 1.0, 1e-5, accountant="basic"))
    with pytest.raises(ValueError, match="both a collection cap and basic"):
        other.open_scope(Scope(COLLECTION, "records", 1.0, 1e-5))


def test_a_copy_never_lands_beside_a_collection_cap(tmp_path):
    from synthgen.privacy.ledger_copy import copy_ledger

    source = _ledger(tmp_path / "a.sqlite", tenants=("alice",), collection_cap=None)
    source.charge("alice", "records", stage="a", event=_pure(0.9), relation=AR)
    _ledger(tmp_path / "b.sqlite", tenants=("bob",), collection_cap=1.0)
    with pytest.raises(ValueError, match="already holds scopes on datasets"):
        copy_ledger(tmp_path / "a.sqlite", tmp_path / "b.sqlite")


def test_a_copy_keeps_the_notes_and_the_pinned_event_shape(tmp_path):
    from synthgen.privacy.ledger_copy import copy_ledger

    source = _ledger(tmp_path / "a.sqlite", tenants=("alice",), collection_cap=5.0)
    source.note_scope(COLLECTION, "records", "encoder asserted independent of the collection")
    source.pin_event_shape(COLLECTION, "records", '{"mechanism": "icl"}')
    source.charge("alice", "records", stage="a", event=_pure(0.5), relation=AR)
    copy_ledger(tmp_path / "a.sqlite", tmp_path / "b.sqlite")
    target = PrivacyLedger(tmp_path / "b.sqlite")
    assert target.scope_notes(COLLECTION, "records") == [
        "encoder asserted independent of the collection"
    ]
    assert target.event_shape(COLLECTION, "records") == '{"mechanism": "icl"}'

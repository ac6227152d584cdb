"""Budget ledger: refusal changes nothing, persistence, concurrent charges never overspend."""

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from synthgen.privacy import accounting
from synthgen.privacy.errors import BudgetExceededError, UnsupportedEventError
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from tests.synthgen.privacy.ledger_schemas import write_schema_5_ledger
from tests.synthgen.privacy.ledger_workers import charge_until_refused, race_processes

AR = "ADD_OR_REMOVE_ONE"


def assert_sound_and_tight(stated, exact, rel=1e-3):
    """The running summary never states less than a recomposition, and hardly more."""
    assert exact * (1 - 1e-9) <= stated <= exact * (1 + rel)


def _open(tmp_path, accountant="pld", cap=2.0):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("acme", "queries", cap, 1e-5, accountant))
    return ledger


def _charge(ledger, stage, event, **options):
    """One add/remove-one charge to the ("acme", "queries") scope that `_open` opens."""
    return ledger.charge("acme", "queries", stage=stage, relation=AR, event=event, **options)


def test_refused_charge_changes_nothing(tmp_path):
    ledger = _open(tmp_path)
    ledger.charge(
        "acme", "queries", stage="train", relation=AR, event=accounting.pure_epsilon_event(1.5)
    )
    before_charges = ledger.charges("acme", "queries")
    before_spend = ledger.spent("acme", "queries")
    with pytest.raises(BudgetExceededError):
        ledger.charge(
            "acme", "queries", stage="rag", relation=AR, event=accounting.pure_epsilon_event(1.0)
        )
    assert ledger.charges("acme", "queries") == before_charges
    assert ledger.spent("acme", "queries") == before_spend


def test_check_is_a_dry_run_of_charge(tmp_path):
    ledger = _open(tmp_path)
    ledger.charge(
        "acme", "queries", stage="train", relation=AR, event=accounting.pure_epsilon_event(1.5)
    )
    eps, _ = ledger.check(
        "acme", "queries", stage="x", relation=AR, event=accounting.pure_epsilon_event(0.4)
    )
    assert eps == pytest.approx(0.4)
    with pytest.raises(BudgetExceededError):
        ledger.check(
            "acme", "queries", stage="x", relation=AR, event=accounting.pure_epsilon_event(0.6)
        )
    assert len(ledger.charges("acme", "queries")) == 1  # neither check recorded anything


def test_spend_is_the_composition_under_the_accountant(tmp_path):
    ledger = _open(tmp_path, cap=10.0)
    events = [
        accounting.dpsgd_event(noise_multiplier=1.0, num_examples=1000, batch_size=10, steps=100),
        accounting.pure_epsilon_event(0.5),
        accounting.gaussian_event(4.0),
    ]
    for e in events:
        ledger.charge("acme", "queries", stage="s", relation=AR, event=e)
    spend = ledger.spent("acme", "queries")
    assert_sound_and_tight(spend.epsilon, accounting.epsilon(accounting.compose(events), 1e-5))
    assert spend.epsilon_remaining == pytest.approx(10.0 - spend.epsilon)
    assert spend.num_charges == 3
    # Each charge records its standalone guarantee too.
    first = ledger.charges("acme", "queries")[0]
    assert first.epsilon == pytest.approx(accounting.epsilon(events[0], 1e-5))
    assert first.delta == 1e-5


def test_persists_across_reopen(tmp_path):
    ledger = _open(tmp_path)
    _charge(ledger, "train", accounting.pure_epsilon_event(0.4), description="run 7")
    reopened = PrivacyLedger(tmp_path / "ledger.sqlite")
    [charge] = reopened.charges("acme", "queries")
    assert (charge.stage, charge.epsilon, charge.description) == ("train", 0.4, "run 7")
    assert reopened.spent("acme", "queries").epsilon == pytest.approx(0.4, abs=1e-3)
    with pytest.raises(ValueError, match="different cap"):
        reopened.open_scope(Scope("acme", "queries", 99.0, 1e-5))
    assert reopened.open_scope(Scope("acme", "queries", 2.0, 1e-5)).epsilon_cap == 2.0


def test_basic_accountant_sums_and_needs_delta(tmp_path):
    ledger = _open(tmp_path, accountant="basic", cap=2.0)
    ledger.charge(
        "acme", "queries", stage="a", relation=AR, event=accounting.epsilon_delta_event(0.5, 4e-6)
    )
    with pytest.raises(ValueError, match="explicit delta"):
        ledger.charge(
            "acme", "queries", stage="b", relation=AR, event=accounting.gaussian_event(5.0)
        )
    ledger.charge(
        "acme", "queries", stage="b", relation=AR, event=accounting.gaussian_event(5.0), delta=5e-6
    )
    spend = ledger.spent("acme", "queries")
    assert spend.delta == pytest.approx(9e-6)
    with pytest.raises(BudgetExceededError):  # delta would exceed the cap
        _charge(ledger, "c", accounting.epsilon_delta_event(0.01, 2e-6))


def test_rdp_scope_refuses_approximate_events(tmp_path):
    ledger = _open(tmp_path, accountant="rdp")
    with pytest.raises(UnsupportedEventError):
        _charge(ledger, "x", accounting.epsilon_delta_event(0.1, 1e-9))
    assert ledger.charges("acme", "queries") == []


def test_unknown_scope_and_bad_scope():
    with pytest.raises(ValueError):
        Scope("t", "d", -1.0, 1e-5)
    with pytest.raises(ValueError):
        Scope("t", "d", 1.0, 1.0)
    with pytest.raises(ValueError):
        Scope("", "d", 1.0, 1e-5)


STEP = 0.25


def _how_many_fit(cap):
    """Sequentially, how many STEP charges the PLD accountant admits under `cap`."""
    k = 0
    while accounting.epsilon(
        accounting.compose([accounting.pure_epsilon_event(STEP)] * (k + 1)), 1e-5
    ) <= cap * (1 + 1e-9):
        k += 1
    return k


_charge_until_refused = partial(charge_until_refused, query="queries", epsilon=STEP)


def test_eight_processes_never_overspend(tmp_path):
    cap = 2.0
    _open(tmp_path, cap=cap)
    path = tmp_path / "ledger.sqlite"
    accepted = race_processes(path, [_charge_until_refused] * 8)
    ledger = PrivacyLedger(path)
    assert sum(accepted) == len(ledger.charges("acme", "queries")) == _how_many_fit(cap)
    assert ledger.spent("acme", "queries").epsilon <= cap


def test_threads_never_overspend(tmp_path):
    cap = 1.5
    _open(tmp_path, cap=cap)
    path = tmp_path / "ledger.sqlite"
    with ThreadPoolExecutor(8) as pool:
        accepted = list(pool.map(_charge_until_refused, [path] * 8))
    assert sum(accepted) == _how_many_fit(cap)
    assert PrivacyLedger(path).spent("acme", "queries").epsilon <= cap


def test_ensure_scope_opens_once_and_then_keeps_the_stored_cap(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    first = ledger.ensure_scope(Scope("acme", "docs", 2.0, 1e-5))
    assert first == ledger.get_scope("acme", "docs")
    again = ledger.ensure_scope(Scope("acme", "docs", 50.0, 1e-5))  # a later, larger ask
    assert again.epsilon_cap == 2.0
    with pytest.raises(ValueError, match="different cap"):
        ledger.open_scope(Scope("acme", "docs", 50.0, 1e-5))


# ---- each charge carries its neighbouring relation ----------------------------------------


SHUFFLE_RUN = dict(noise_multiplier=0.8, num_examples=400, batch_size=20, steps=30)


def _shuffle_event():
    return accounting.dpsgd_event(**SHUFFLE_RUN, sampling="shuffle")


def test_replace_one_charge_is_refused_by_an_add_remove_scope(tmp_path):
    from synthgen.privacy.errors import RelationMismatchError

    ledger = _open(tmp_path, cap=100.0)
    with pytest.raises(RelationMismatchError):
        ledger.charge("acme", "queries", stage="t", event=_shuffle_event(), relation="REPLACE_ONE")
    with pytest.raises(RelationMismatchError):
        ledger.check("acme", "queries", stage="t", event=_shuffle_event(), relation="REPLACE_ONE")
    assert ledger.charges("acme", "queries") == []


def test_replace_one_scope_records_a_shuffle_run_at_its_stated_epsilon(tmp_path):
    # The audit: a shuffle plan stated at 13.49 was recorded as 6.77 under add/remove.
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("acme", "queries", 100.0, 1e-5, relation="REPLACE_ONE"))
    charge = ledger.charge(
        "acme", "queries", stage="t", event=_shuffle_event(), relation="REPLACE_ONE"
    )
    stated = accounting.dpsgd_epsilon(**SHUFFLE_RUN, delta=1e-5, sampling="shuffle")
    assert charge.relation == "REPLACE_ONE"
    assert charge.epsilon == pytest.approx(stated, rel=1e-9)
    assert_sound_and_tight(ledger.spent("acme", "queries").epsilon, stated)


def test_add_remove_charge_converts_soundly_into_a_replace_one_scope(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("acme", "queries", 100.0, 1e-5, relation="REPLACE_ONE"))
    charge = ledger.charge(
        "acme", "queries", stage="a", event=accounting.pure_epsilon_event(1.0), relation=AR
    )
    assert charge.epsilon == pytest.approx(2.0)  # group privacy of size 2
    assert charge.relation == AR  # recorded as analysed; converted when composed
    ledger.charge("acme", "queries", stage="b", event=_shuffle_event(), relation="REPLACE_ONE")
    both = accounting.compose([accounting.pure_epsilon_event(2.0), _shuffle_event()])
    want = accounting.epsilon(both, 1e-5, relation=accounting.NeighboringRelation.REPLACE_ONE)
    assert_sound_and_tight(ledger.spent("acme", "queries").epsilon, want)


# ---- validation: no charge can refund budget -----------------------------------------------


@pytest.mark.parametrize("accountant", ["pld", "rdp", "basic"])
def test_invalid_events_never_reach_the_ledger(tmp_path, accountant):
    from dp_accounting import dp_event

    ledger = _open(tmp_path, accountant=accountant, cap=1.0)
    bad = [
        dp_event.GaussianDpEvent(-1.0),
        dp_event.GaussianDpEvent(float("nan")),
        dp_event.LaplaceDpEvent(-0.5),
        dp_event.PoissonSampledDpEvent(1.5, dp_event.GaussianDpEvent(1.0)),
        dp_event.SelfComposedDpEvent(accounting.pure_epsilon_event(1.0), -1),
        dp_event.NonPrivateDpEvent(),
    ]
    for event in bad:
        with pytest.raises((ValueError, UnsupportedEventError)):
            ledger.charge("acme", "queries", stage="x", event=event, relation=AR, delta=1e-6)
    with pytest.raises(ValueError):
        accounting.epsilon_delta_event(-10, -1e-3)
    assert ledger.charges("acme", "queries") == []
    # The audit's refund: after the refused negative charge, only one 1.0 fits in cap 1.0.
    accepted = 0
    for _ in range(5):
        try:
            ledger.charge(
                "acme", "queries", stage="x", event=accounting.pure_epsilon_event(1.0), relation=AR
            )
            accepted += 1
        except BudgetExceededError:
            pass
    assert accepted == 1
    assert ledger.spent("acme", "queries").epsilon == pytest.approx(1.0, abs=1e-3)


def test_charge_refuses_unknown_relation_and_bad_delta(tmp_path):
    ledger = _open(tmp_path)
    event = accounting.gaussian_event(5.0)
    with pytest.raises(ValueError, match="relation"):
        ledger.charge("acme", "queries", stage="x", event=event, relation="SOMETIMES")
    with pytest.raises(ValueError, match="delta"):
        ledger.charge("acme", "queries", stage="x", event=event, relation=AR, delta=1.5)
    assert ledger.charges("acme", "queries") == []


# ---- idempotent charges --------------------------------------------------------------------


def test_a_charge_ref_is_paid_once(tmp_path):
    ledger = _open(tmp_path)
    event = accounting.pure_epsilon_event(0.5)
    first = ledger.charge("acme", "queries", stage="t", event=event, relation=AR, ref="run-1")
    again = ledger.charge("acme", "queries", stage="t", event=event, relation=AR, ref="run-1")
    assert again == first
    assert ledger.find_charge("acme", "queries", "run-1") == first
    assert ledger.find_charge("acme", "queries", "run-2") is None
    assert len(ledger.charges("acme", "queries")) == 1
    with pytest.raises(ValueError, match="different charge"):
        _charge(ledger, "t", accounting.pure_epsilon_event(0.7), ref="run-1")


def test_a_ledger_written_before_relations_keeps_its_meaning(tmp_path):
    ledger = _legacy_ledger(
        tmp_path / "old.sqlite", AR, "pld", 1.0, 0.0, accounting.pure_epsilon_event(1.0)
    )
    [charge] = ledger.charges("acme", "q")
    assert (charge.relation, charge.ref) == (AR, None)
    assert ledger.spent("acme", "q").epsilon == pytest.approx(1.0, abs=1e-3)
    ledger.charge("acme", "q", stage="s", event=accounting.pure_epsilon_event(1.0), relation=AR)
    assert ledger.spent("acme", "q").num_charges == 2


def test_converted_noise_means_the_same_to_both_accountants(tmp_path):
    # G(sigma=4) analysed under add/remove is, under replace-one, a Gaussian at sensitivity 2:
    # exactly N(0, 2^2) vs N(1, 2^2) at unit sensitivity.
    exact = accounting.epsilon(accounting.gaussian_event(2.0), 1e-5)
    stated = {}
    for kind in ("pld", "rdp"):
        ledger = PrivacyLedger(tmp_path / f"{kind}.sqlite")
        ledger.open_scope(Scope("acme", "q", 100.0, 1e-5, kind, relation="REPLACE_ONE"))
        charge = ledger.charge(
            "acme", "q", stage="g", event=accounting.gaussian_event(4.0), relation=AR
        )
        stated[kind] = charge.epsilon
    assert stated["pld"] == pytest.approx(exact, rel=1e-3)
    assert exact <= stated["rdp"] <= 1.2 * exact  # RDP is looser, never below


def test_laplace_converts_into_a_replace_one_pld_scope(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("acme", "q", 100.0, 1e-5, relation="REPLACE_ONE"))
    charge = ledger.charge("acme", "q", stage="l", event=accounting.laplace_event(1.0), relation=AR)
    assert 1.9 <= charge.epsilon <= 2.0 + 1e-6  # epsilon 1 under add/remove, 2 under replace


def _legacy_ledger(path, relation, accountant, epsilon, delta, event):
    import sqlite3

    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE scopes (tenant TEXT NOT NULL, dataset TEXT NOT NULL,
          epsilon_cap REAL NOT NULL, delta_cap REAL NOT NULL, accountant TEXT NOT NULL,
          relation TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (tenant, dataset));
        CREATE TABLE charges (id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL,
          dataset TEXT NOT NULL, stage TEXT NOT NULL, epsilon REAL NOT NULL,
          delta REAL NOT NULL, event TEXT NOT NULL, description TEXT NOT NULL,
          created_at REAL NOT NULL);
        """
    )
    conn.execute(
        "INSERT INTO scopes VALUES ('acme', 'q', 1000.0, 1e-5, ?, ?, 0)", (accountant, relation)
    )
    conn.execute(
        "INSERT INTO charges (tenant, dataset, stage, epsilon, delta, event, description,"
        " created_at) VALUES ('acme', 'q', 's', ?, ?, ?, '', 0)",
        (epsilon, delta, accounting.event_to_json(event)),
    )
    conn.commit()
    conn.close()
    return PrivacyLedger(path)


def test_an_old_negative_charge_makes_the_scope_fail_closed(tmp_path):
    from dp_accounting import dp_event

    from synthgen.privacy.errors import PrivacyError

    ledger = _legacy_ledger(
        tmp_path / "old.sqlite", AR, "basic", -10.0, 0.0, dp_event.LaplaceDpEvent(1.0)
    )
    with pytest.raises(PrivacyError, match="invalid charge"):
        ledger.charge("acme", "q", stage="s", event=accounting.pure_epsilon_event(1.0), relation=AR)
    with pytest.raises(PrivacyError, match="invalid charge"):
        ledger.spent("acme", "q")


def test_an_old_without_replacement_row_is_restated_never_smaller(tmp_path):
    from dp_accounting import dp_event

    old = dp_event.SelfComposedDpEvent(
        dp_event.SampledWithoutReplacementDpEvent(400, 20, dp_event.GaussianDpEvent(0.8)), 30
    )
    ledger = _legacy_ledger(tmp_path / "old.sqlite", "REPLACE_ONE", "rdp", 6.2, 1e-5, old)
    want = accounting.dpsgd_epsilon(**SHUFFLE_RUN, delta=1e-5, sampling="shuffle", accountant="rdp")
    assert ledger.spent("acme", "q").epsilon == pytest.approx(want, rel=1e-9)
    assert want > 40  # the old row stated 6.2
    with pytest.raises(UnsupportedEventError):  # and no new charge may use the old form
        ledger.charge("acme", "q", stage="s", event=old, relation="REPLACE_ONE")


def test_charge_all_is_all_or_nothing_and_idempotent(tmp_path):
    book = PrivacyLedger(tmp_path / "ledger.sqlite")
    book.open_scope(Scope("t", "d", 1.0, 1e-5))
    items = [
        ("rag-retrieval", accounting.pure_epsilon_event(0.2), "answer"),
        ("rag-tokens", accounting.self_composed(accounting.pure_epsilon_event(0.1), 4), "answer"),
    ]
    first = book.charge_all("t", "d", items, relation="ADD_OR_REMOVE_ONE", ref="a1")
    assert [c.stage for c in first] == ["rag-retrieval", "rag-tokens"]
    assert [c.ref for c in first] == ["a1/0", "a1/1"]
    again = book.charge_all("t", "d", items, relation="ADD_OR_REMOVE_ONE", ref="a1")
    assert again == first and len(book.charges("t", "d")) == 2
    with pytest.raises(ValueError):  # the same ref for other events
        book.charge_all("t", "d", items[:1] * 2, relation="ADD_OR_REMOVE_ONE", ref="a1")
    # about 0.6 spent: three 0.3 stages together pass the cap, so none of them is recorded
    over = [(f"s{i}", accounting.pure_epsilon_event(0.3), "") for i in range(3)]
    with pytest.raises(BudgetExceededError):
        book.charge_all("t", "d", over, relation="ADD_OR_REMOVE_ONE", ref="a2")
    assert len(book.charges("t", "d")) == 2
    with pytest.raises(ValueError):
        book.charge_all("t", "d", [], relation="ADD_OR_REMOVE_ONE")


ANSWER_STAGES = [
    ("rag-retrieval", accounting.pure_epsilon_event(0.3)),
    ("rag-tokens", accounting.epsilon_delta_event(0.9, 1e-7)),
    ("rag-score", accounting.laplace_event(0.4)),
]


@pytest.mark.parametrize(
    ("accountant", "collection_cap"), [("basic", None), ("pld", None), ("pld", 9.0)]
)
def test_repeats_that_fit_is_how_many_charges_the_ledger_then_admits(
    tmp_path, accountant, collection_cap
):
    """The count follows the ledger's own admission rule, not epsilon arithmetic."""
    from synthgen.privacy import COLLECTION

    book = PrivacyLedger(tmp_path / "ledger.sqlite")
    book.open_scope(Scope("alice", "d", 12.0, 1e-5, accountant=accountant))
    if collection_cap is not None:
        book.open_scope(Scope(COLLECTION, "d", collection_cap, 1e-5))
    items = [(stage, event, "answer") for stage, event in ANSWER_STAGES]
    charge = partial(book.charge_all, "alice", "d", items, relation=AR, delta=1e-6)
    charge()  # one answer already spent
    predicted = book.repeats_that_fit("alice", "d", ANSWER_STAGES, relation=AR, delta=1e-6)
    assert book.charges("alice", "d")[-1].stage == "rag-score"  # the count recorded nothing
    admitted = 0
    while True:
        try:
            charge()
        except BudgetExceededError:
            break
        admitted += 1
    assert predicted == admitted
    assert book.repeats_that_fit("alice", "d", ANSWER_STAGES, relation=AR, delta=1e-6) == 0


def test_repeats_that_fit_counts_what_composition_leaves_not_epsilon_arithmetic(tmp_path):
    """Pure token events compose sublinearly under PLD: the next answer costs less than the
    answer's own epsilon, so more answers fit than remaining epsilon / epsilon says."""
    stages = [
        ("rag-retrieval", accounting.pure_epsilon_event(0.1)),
        ("rag-tokens", accounting.self_composed(accounting.pure_epsilon_event(0.05), 20)),
    ]
    book = PrivacyLedger(tmp_path / "ledger.sqlite")
    book.open_scope(Scope("alice", "d", 8.0, 1e-5))
    items = [(stage, event, "answer") for stage, event in stages]
    book.charge_all("alice", "d", items, relation=AR, delta=1e-6)
    one = accounting.epsilon(accounting.compose([e for _, e in stages]), 1e-6)
    remaining = book.spent("alice", "d").epsilon_remaining
    fits = book.repeats_that_fit("alice", "d", stages, relation=AR, delta=1e-6)
    assert fits > int(remaining / one) + 1
    for _ in range(fits):
        book.charge_all("alice", "d", items, relation=AR, delta=1e-6)
    with pytest.raises(BudgetExceededError):
        book.charge_all("alice", "d", items, relation=AR, delta=1e-6)


def test_repeats_that_fit_stops_at_its_limit_and_knows_no_missing_scope(tmp_path):
    book = PrivacyLedger(tmp_path / "ledger.sqlite")
    book.open_scope(Scope("alice", "d", 1000.0, 1e-5))
    tiny = [("a", accounting.pure_epsilon_event(0.01))]
    assert book.repeats_that_fit("alice", "d", tiny, relation=AR, limit=7) == 7
    assert book.repeats_that_fit("alice", "d", tiny, relation=AR, limit=0) == 0
    with pytest.raises(KeyError):
        book.repeats_that_fit("bob", "d", tiny, relation=AR)
    with pytest.raises(ValueError):
        book.repeats_that_fit(
            "alice", "d", [("a", accounting.pure_epsilon_event(-1.0))], relation=AR
        )


def test_the_first_event_shape_is_pinned_and_another_is_refused(tmp_path):
    from synthgen.privacy.ledger_types import EventShapeError

    ledger = _open(tmp_path)
    assert ledger.event_shape("acme", "queries") is None
    assert ledger.pin_event_shape("acme", "queries", '{"epsilon":1}') is True
    assert ledger.pin_event_shape("acme", "queries", '{"epsilon":1}') is False
    with pytest.raises(EventShapeError) as refused:
        ledger.pin_event_shape("acme", "queries", '{"epsilon":2}')
    assert (refused.value.recorded, refused.value.requested) == ('{"epsilon":1}', '{"epsilon":2}')
    assert PrivacyLedger(tmp_path / "ledger.sqlite").event_shape("acme", "queries") == (
        '{"epsilon":1}'
    )
    with pytest.raises(KeyError):
        ledger.pin_event_shape("nobody", "queries", "x")
    with pytest.raises(ValueError):
        ledger.pin_event_shape("acme", "queries", "")


def test_concurrent_pins_of_two_shapes_leave_exactly_one(tmp_path):
    from synthgen.privacy.ledger_types import EventShapeError

    _open(tmp_path)

    def pin(i):
        try:
            PrivacyLedger(tmp_path / "ledger.sqlite").pin_event_shape(
                "acme", "queries", "ab"[i % 2]
            )
            return "ab"[i % 2]
        except EventShapeError:
            return None

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(pin, range(16)))
    winner = PrivacyLedger(tmp_path / "ledger.sqlite").event_shape("acme", "queries")
    assert winner in ("a", "b")
    assert [o for o in outcomes if o is not None] == [winner] * 8  # every other pin refused


def test_scope_notes_are_appended_once_and_kept(tmp_path):
    ledger = _open(tmp_path)
    assert ledger.scope_notes("acme", "queries") == []
    assert ledger.note_scope("acme", "queries", "encoder e: asserted") == ["encoder e: asserted"]
    ledger.note_scope("acme", "queries", "encoder e: asserted")
    ledger.note_scope("acme", "queries", "second")
    assert PrivacyLedger(tmp_path / "ledger.sqlite").scope_notes("acme", "queries") == [
        "encoder e: asserted",
        "second",
    ]
    with pytest.raises(ValueError):
        ledger.note_scope("acme", "queries", "two\nlines")
    with pytest.raises(KeyError):
        ledger.note_scope("nobody", "queries", "x")
    # notes and shapes are not part of a scope's identity: reopening it still matches
    assert ledger.open_scope(Scope("acme", "queries", 2.0, 1e-5)) == ledger.get_scope(
        "acme", "queries"
    )


def test_a_schema_5_ledger_is_migrated_with_its_scopes_and_charges(tmp_path):
    import sqlite3

    from synthgen.privacy.ledger_store import SCHEMA_VERSION

    path = tmp_path / "v5.sqlite"
    conn = sqlite3.connect(path)
    write_schema_5_ledger(conn, "sqlite")
    conn.execute(
        "INSERT INTO charges (tenant, dataset, stage, epsilon, delta, event, description, "
        "created_at, relation) VALUES ('*', 'q', 's', 1.0, 0.0, ?, 'old', 0, ?)",
        (accounting.event_to_json(accounting.pure_epsilon_event(1.0)), AR),
    )
    conn.commit()
    conn.close()
    assert SCHEMA_VERSION == 11
    ledger = PrivacyLedger(path)
    assert ledger.get_scope("*", "q") == Scope("*", "q", 5.0, 1e-5)
    assert [c.description for c in ledger.charges("*", "q")] == ["old"]
    assert ledger.event_shape("*", "q") is None and ledger.scope_notes("*", "q") == []
    ledger.pin_event_shape("*", "q", "shape")
    ledger.note_scope("*", "q", "note")
    ledger.charge("*", "q", stage="t", relation=AR, event=accounting.pure_epsilon_event(1.0))
    assert ledger.spent("*", "q").epsilon == pytest.approx(2.0, abs=1e-3)
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 11
    assert ledger.document_groups() == []  # migrations 9, 10: bindings

"""How a privacy ledger composes a scope's record: admission checks, summaries, recomposition.

`LedgerComposition`, a base class of `ledger.PrivacyLedger`: the check of new events
against a scope's cap and its dataset's collection cap (`_check_scopes`), standalone
figures, re-validation of stored rows, the running and stated summaries kept caught up
with the committed rows, and the recomposition behind `verify` (guarantees: `ledger.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dp_accounting import dp_event

from synthgen.privacy.accountants import make_accountant
from synthgen.privacy.errors import BudgetExceededError, PrivacyError, UnsupportedEventError
from synthgen.privacy.events import (
    EpsilonDeltaDpEvent,
    NeighboringRelation,
    compose,
    convert_relation,
    event_from_json,
    event_to_json,
    restate_legacy,
    validate_event,
)
from synthgen.privacy.ledger_store import Connection
from synthgen.privacy.ledger_types import COLLECTION, Recomposition, Scope
from synthgen.privacy.summary import EventTally, ScopeSummary, event_pld, pld_epsilon

_CHARGE_COLUMNS = (
    "id, tenant, dataset, stage, epsilon, delta, event, description, charges.created_at, "
    "COALESCE(charges.relation, scopes.relation), ref"
)
_CHARGE_FROM = "charges JOIN scopes USING (tenant, dataset)"


def _rows_of(tenant: str, dataset: str) -> tuple[str, tuple[str, ...]]:
    """SQL condition and parameters selecting a scope's charges."""
    if tenant == COLLECTION:
        return "dataset = ?", (dataset,)
    return "tenant = ? AND dataset = ?", (tenant, dataset)


def _rows_after(conn: Connection, scope: Scope, last_id: int) -> list:
    """The scope's charge rows after id `last_id`, oldest first: (id, event, epsilon,
    delta, relation, created_at)."""
    where, params = _rows_of(scope.tenant, scope.dataset)
    return conn.execute(
        "SELECT charges.id, event, epsilon, delta, "
        f"COALESCE(charges.relation, scopes.relation), charges.created_at FROM {_CHARGE_FROM}"
        f" WHERE {where} AND charges.id > ? ORDER BY charges.id",
        (*params, last_id),
    ).fetchall()


def _fresh(
    conn: Connection, scope: Scope, summary: ScopeSummary, last_id: int, last_time: float | None
) -> bool:
    """Whether a cache ending with row `last_id` still describes the scope: same accountant
    and relation, and that row still there (same ledger, not replaced)."""
    if (summary.accountant, summary.relation) != (scope.accountant, scope.relation):
        return False
    if last_id == 0:
        return True
    where, params = _rows_of(scope.tenant, scope.dataset)
    row = conn.execute(
        f"SELECT created_at FROM charges WHERE id = ? AND {where}", (last_id, *params)
    ).fetchone()
    return row is not None and row[0] == last_time


def _within(scope: Scope, epsilon: float, delta: float) -> bool:
    """Whether a composed spend is within the scope's caps (False on NaN: fails closed)."""
    return epsilon <= scope.epsilon_cap * (1 + 1e-9) and delta <= scope.delta_cap


class LedgerComposition:
    """Composition logic of `PrivacyLedger` (its base class; not used on its own).

    Reads the subclass's `_scope` and keeps its caches `_summaries` and `_stated` under
    `_cache_lock`, all set by `PrivacyLedger.__init__`.
    """

    # ---- admission --------------------------------------------------------------------

    def _check_scopes(
        self, conn, tenant, dataset, stage_events, relation, delta
    ) -> list[tuple[Scope, ScopeSummary, list[tuple[float, float]]]]:
        """`_check_all` for the tenant's scope, then for the dataset's collection scope if
        it has one (a charge to the collection scope itself checks that scope only)."""
        checked = [self._check_all(conn, tenant, dataset, stage_events, relation, delta)]
        if tenant != COLLECTION and self._scope(conn, COLLECTION, dataset) is not None:
            # the rows keep the tenant's figures; the collection (pld/rdp) composes events
            figures = checked[0][2]
            checked.append(
                self._check_all(conn, COLLECTION, dataset, stage_events, relation, delta, figures)
            )
        return checked

    def _prepared(
        self, scope: Scope, stage_events, relation, delta, figures=None
    ) -> list[tuple[str, tuple[float, float]]]:
        """(event JSON in the scope's relation, standalone figures) of each new event;
        the figures are `figures` when given (as the rows will record them)."""
        prepared = []
        for i, (_, event) in enumerate(stage_events):
            event = convert_relation(event, relation, scope.relation)
            event_json = event_to_json(event)
            own = figures[i] if figures else self._standalone(scope, event, event_json, delta)
            prepared.append((event_json, own))
        return prepared

    def _check_all(
        self, conn, tenant, dataset, stage_events, relation, delta, figures=None
    ) -> tuple[Scope, ScopeSummary, list[tuple[float, float]]]:
        """The scope, its summary with every new event folded in, and each new event's
        standalone (epsilon, delta) (`figures` if given, as the rows will record them);
        BudgetExceededError if the composed spend would pass the cap."""
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta=}")
        scope = self._scope(conn, tenant, dataset)
        if scope is None:
            raise KeyError(f"no ledger scope for {tenant=}, {dataset=}; open it first")
        summary = self._summary(conn, scope)
        prepared = self._prepared(scope, stage_events, relation, delta, figures)
        for event_json, own in prepared:
            summary = summary.extended(event_json, own)
        standalone = [own for _, own in prepared]
        total_eps, total_delta = summary.spend(scope.delta_cap)
        if not _within(scope, total_eps, total_delta):
            stages = "+".join(stage for stage, _ in stage_events)
            who = (
                f"the collection cap of {dataset} (all tenants together)"
                if scope.is_collection
                else f"({tenant}, {dataset})"
            )
            raise BudgetExceededError(
                f"charge refused for {who} stage={stages}: spend would be "
                f"epsilon={total_eps:.4g}, delta={total_delta:.3g} over cap "
                f"epsilon={scope.epsilon_cap:g}, delta={scope.delta_cap:g}",
                tenant=tenant,
                dataset=dataset,
            )
        return scope, summary, standalone

    # ---- accounting -------------------------------------------------------------------

    def _standalone(
        self, scope: Scope, event: dp_event.DpEvent, event_json: str, delta: float | None
    ) -> tuple[float, float]:
        if isinstance(event, EpsilonDeltaDpEvent):
            return event.epsilon, event.delta
        if delta is None:
            if scope.accountant == "basic":
                raise ValueError("the basic accountant needs an explicit delta for this event")
            delta = scope.delta_cap
        if scope.accountant == "rdp":
            return ScopeSummary("rdp", scope.relation).extended(event_json, (0, 0)).epsilon(
                delta
            ), delta
        return pld_epsilon(event_pld(event_json, scope.relation), delta), delta

    def _row_record(self, scope: Scope, row: Sequence) -> tuple[str, tuple[float, float]]:
        """(event JSON in the scope's relation, standalone figures) of a stored row."""
        event_json, eps, delta, relation = row
        event = restate_legacy(event_from_json(event_json))
        try:  # a stored row is re-validated: an old file may hold what is now refused
            validate_event(event)
            EpsilonDeltaDpEvent(eps, delta)
        except (ValueError, UnsupportedEventError) as exc:
            raise PrivacyError(
                f"scope ({scope.tenant}, {scope.dataset}) holds an invalid charge ({exc}); "
                "the ledger refuses to compose it"
            ) from None
        event = convert_relation(event, relation, scope.relation)
        return event_to_json(event), (eps, delta)

    def _summary(self, conn: Connection, scope: Scope) -> ScopeSummary:
        """The scope's running summary, caught up with every committed row (constant
        time when this object made the last charges; one rebuild when it first looks)."""
        with self._cache_lock:
            cached = self._summaries.get((scope.tenant, scope.dataset))
        if cached is not None and _fresh(conn, scope, cached[0], cached[0].last_id, cached[1]):
            summary = cached[0]
            rows = _rows_after(conn, scope, summary.last_id)
            for row in rows:
                event_json, figures = self._row_record(scope, row[1:5])
                summary = summary.extended(event_json, figures, last_id=int(row[0]))
            if rows:
                self._remember(scope, summary, rows[-1][5])
            return summary
        summary, last_time = self._stated_summary(conn, scope)  # the record's own summary
        self._remember(scope, summary, last_time)
        return summary

    def _stated_summary(self, conn: Connection, scope: Scope) -> tuple[ScopeSummary, float | None]:
        """(the summary of the scope's `EventTally`, the time of its last row): what the
        ledger states, a function of the recorded rows alone. The tally catches up with
        rows committed since this object last looked; the summary is recomposed only when
        there were some."""
        key = (scope.tenant, scope.dataset)
        with self._cache_lock:
            cached = self._stated.get(key)
        tally, last_time, summary = EventTally(), None, None
        if cached is not None and _fresh(conn, scope, cached[2], cached[0].last_id, cached[1]):
            tally, last_time, summary = cached
        rows = _rows_after(conn, scope, tally.last_id)
        if rows or summary is None:
            tally = tally.added(
                [self._row_record(scope, row[1:5]) for row in rows],
                last_id=int(rows[-1][0]) if rows else tally.last_id,
            )
            last_time = rows[-1][5] if rows else last_time
            summary = tally.summary(scope.accountant, scope.relation)
            with self._cache_lock:
                known = self._stated.get(key)
                if known is None or known[0].last_id <= tally.last_id:
                    self._stated[key] = (tally, last_time, summary)
        return summary, last_time

    def _remember(self, scope: Scope, summary: ScopeSummary, last_time: float | None) -> None:
        key = (scope.tenant, scope.dataset)
        with self._cache_lock:
            cached = self._summaries.get(key)
            if cached is None or cached[0].last_id <= summary.last_id:
                self._summaries[key] = (summary, last_time)

    def _recompose(
        self, scope: Scope, records: list[tuple[str, float, float, str]], kind: str
    ) -> float:
        """Epsilon at the delta cap of all records, recomposed by dp-accounting's `kind`."""
        if not records:
            return 0.0
        events = [event_from_json(self._row_record(scope, record)[0]) for record in records]
        composed = compose(events)
        acc = make_accountant(kind, NeighboringRelation[scope.relation])
        if not acc.supports(composed):
            raise UnsupportedEventError(
                f"the {kind} accountant of scope ({scope.tenant}, {scope.dataset}) "
                "cannot compose this event"
            )
        acc.compose(composed)
        return float(acc.get_epsilon(scope.delta_cap))

    def verify(self, tenant: str, dataset: str) -> Recomposition:
        """Recomposes the scope's recorded events from scratch and states both figures.

        Slow (linear in the history): for audits and tests, never on the charge path.
        The running summary (what this object's charge checks use; in a fresh process the
        stated spend of `spent`) is sound if ``stated >= best`` (up to float rounding) and
        tight if ``stated <= 1.05 * best``.
        """
        scope = self.get_scope(tenant, dataset)
        charges = self.charges(tenant, dataset)
        records = [(c.event, c.epsilon, c.delta, c.relation) for c in charges]
        with self._store.read() as conn:
            stated = self._summary(conn, scope).spend(scope.delta_cap)[0]
        if scope.accountant == "basic":
            total = sum(c.epsilon for c in charges)
            return Recomposition(stated, total, total, len(charges))
        figures = {}
        for kind in ("pld", "rdp"):
            try:
                figures[kind] = self._recompose(scope, records, kind)
            except UnsupportedEventError:
                figures[kind] = math.inf
        return Recomposition(stated, figures["pld"], figures["rdp"], len(charges))

"""Persistent privacy budget ledger: one (epsilon, delta) cap per scope, charged before release.

A scope is a (tenant, dataset) pair with a cap, an accountant (``pld``/``rdp``: composition
of the recorded events; ``basic``: sums) and a neighbouring relation. Every event is
validated (`events.validate_event`) and converted to the scope's relation or refused
(`events.convert_relation`). A charge that would pass the cap, or the cap of the dataset's
collection scope (tenant ``COLLECTION``, every tenant's charges), raises
`BudgetExceededError` and records nothing; the check and the insert are one transaction
under the dataset's lock (`ledger_store`), so callers draw noise only after `charge`
returns. Charge checks use a running `summary.ScopeSummary` per scope (constant time per
charge); what the ledger states (`spent`) is the summary of the record's
`summary.EventTally`, one function of the rows. See docs/guides/privacy.md (the ledger
sections) and docs/guides/service.md (collection caps).

Layout: `PrivacyLedger` (this module) holds the scopes and the charges; its base classes
`ledger_records.ScopeRecords` (notes, pinned event shapes), `ledger_documents.DocumentSets`
(the records each name guards) and `ledger_composition.LedgerComposition` (admission,
summaries, recomposition); `ledger_types` the value types; `ledger_store` the database.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dp_accounting import dp_event

from synthgen.privacy import events
from synthgen.privacy.document_filters import DocumentFilters
from synthgen.privacy.errors import BudgetExceededError
from synthgen.privacy.ledger_composition import (
    _CHARGE_COLUMNS,
    _CHARGE_FROM,
    LedgerComposition,
    _rows_of,
    _within,
)
from synthgen.privacy.ledger_documents import GUARANTEES_FLAG, DocumentSets, undeclared_sharing
from synthgen.privacy.ledger_records import ScopeRecords
from synthgen.privacy.ledger_store import Connection, LedgerStore
from synthgen.privacy.ledger_types import (
    COLLECTION,
    Charge,
    Scope,
    Spend,
)
from synthgen.privacy.summary import EventTally, ScopeSummary

_SCOPE_COLUMNS = "tenant, dataset, epsilon_cap, delta_cap, accountant, relation"


class PrivacyLedger(ScopeRecords, DocumentSets, LedgerComposition):
    """Budget ledger shared by every DP stage of the project, on SQLite or PostgreSQL.

    Args:
      location: a SQLite file path (created if missing), ``sqlite:///path`` or
        ``postgresql://user@host:port/db`` (psycopg 3; the server and database must exist).
      timeout: seconds a charge waits for a concurrent writer before failing.
    """

    def __init__(self, location: str | Path, *, timeout: float = 60.0) -> None:
        self._store = LedgerStore(location, timeout=timeout)
        self.path: Path | None = self._store.path
        self.url: str = self._store.url
        self.location: str = self._store.identity  # path or password-free URL
        self.backend: str = self._store.dialect
        self.created: bool = self._store.created  # this object created the file (SQLite)
        self._summaries: dict[tuple[str, str], tuple[ScopeSummary, float | None]] = {}
        self._stated: dict[tuple[str, str], tuple[EventTally, float | None, ScopeSummary]] = {}
        self._cache_lock = threading.Lock()

    @property
    def store(self) -> LedgerStore:
        """The ledger's database, for tables kept beside it (the service's tenants)."""
        return self._store

    def close(self) -> None:
        """Releases this thread's database connection (PostgreSQL)."""
        self._store.close()

    # ---- scopes -----------------------------------------------------------------------

    def open_scope(self, scope: Scope) -> Scope:
        """Creates `scope`, or checks that the stored one has the same cap and accountant.

        Taken under the dataset's charge lock, so a collection scope opened while tenants
        charge sees every charge committed before it and checks every one after.
        """
        with self._store.scope_lock(scope.dataset) as conn:
            self._check_collection_mix(conn, scope)
            conn.execute(
                "INSERT INTO scopes (tenant, dataset, epsilon_cap, delta_cap, accountant, "
                "relation, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (*dataclasses.astuple(scope), time.time()),  # the fields in column order
            )
            stored = self._scope(conn, scope.tenant, scope.dataset)
        if stored != scope:
            raise ValueError(
                f"scope ({scope.tenant}, {scope.dataset}) exists with a different cap or "
                f"accountant: stored={stored}"
            )
        return stored

    @staticmethod
    def _check_collection_mix(conn: Connection, scope: Scope) -> None:
        """A collection cap composes its dataset's events (PLD/RDP), which is not valid for
        charges that only a ``basic`` scope's filter makes sound (realized, data-dependent
        counts), so a dataset has a collection cap or ``basic`` scopes, never both."""
        if scope.is_collection:
            clash = conn.execute(
                "SELECT 1 FROM scopes WHERE dataset = ? AND accountant = 'basic'", (scope.dataset,)
            ).fetchone()
        elif scope.accountant == "basic":
            clash = conn.execute(
                "SELECT 1 FROM scopes WHERE dataset = ? AND tenant = ?", (scope.dataset, COLLECTION)
            ).fetchone()
        else:
            return
        if clash is not None and PrivacyLedger._scope(conn, scope.tenant, scope.dataset) is None:
            raise ValueError(
                f"{scope.dataset} cannot have both a collection cap and basic scopes (a "
                "collection composes events, which is not valid for a basic scope's "
                "pay-as-you-go charges)"
            )

    def ensure_scope(self, scope: Scope) -> Scope:
        """Returns the stored (tenant, dataset) scope, or opens `scope` if there is none.

        Unlike `open_scope`, an existing scope wins whatever its cap: its budget governs.
        """
        try:
            return self.get_scope(scope.tenant, scope.dataset)
        except KeyError:
            return self.open_scope(scope)

    def get_scope(self, tenant: str, dataset: str) -> Scope:
        """Returns the stored scope; KeyError if it does not exist."""
        with self._store.read() as conn:
            return self._stored_scope(conn, tenant, dataset)

    def scopes(self) -> list[Scope]:
        """All scopes in the ledger, in creation order."""
        with self._store.read() as conn:
            rows = conn.execute(
                f"SELECT {_SCOPE_COLUMNS} FROM scopes ORDER BY created_at, tenant, dataset"
            ).fetchall()
        return [Scope(*row) for row in rows]

    def collection_scope(self, dataset: str) -> Scope | None:
        """The dataset's collection scope (cap over all tenants together), if it has one."""
        try:
            return self.get_scope(COLLECTION, dataset)
        except KeyError:
            return None

    @staticmethod
    def _scope(conn: Connection, tenant: str, dataset: str) -> Scope | None:
        row = conn.execute(
            f"SELECT {_SCOPE_COLUMNS} FROM scopes WHERE tenant = ? AND dataset = ?",
            (tenant, dataset),
        ).fetchone()
        return None if row is None else Scope(*row)

    @staticmethod
    def _stored_scope(conn: Connection, tenant: str, dataset: str) -> Scope:
        """`_scope`; KeyError if it does not exist."""
        scope = PrivacyLedger._scope(conn, tenant, dataset)
        if scope is None:
            raise KeyError(f"no ledger scope for {tenant=}, {dataset=}")
        return scope

    # ---- charges ----------------------------------------------------------------------

    def charge(
        self,
        tenant: str,
        dataset: str,
        *,
        stage: str,
        event: dp_event.DpEvent,
        relation: events.NeighboringRelation | str,
        description: str = "",
        delta: float | None = None,
        ref: str | None = None,
    ) -> Charge:
        """Records `event` against the scope if the composed spend stays within the cap.

        Args:
          tenant: scope tenant.
          dataset: scope dataset.
          stage: which stage spends (e.g. "train-generator", "rag-answer").
          event: the DpEvent of the release that follows this charge.
          relation: the neighbouring relation under which `event` is analysed
            ("ADD_OR_REMOVE_ONE" or "REPLACE_ONE"); converted to the scope's if sound.
          description: public description (ids, parameters; never private data).
          delta: delta at which to state this charge's standalone epsilon; default the
            scope's cap. Required meaning for the ``basic`` accountant: its share of delta.
          ref: idempotency key (a public random id): if the scope already holds a charge
            with this ref, that charge is returned and nothing new is charged, so a run
            that crashed after charging can call again without paying twice.

        Returns:
          The recorded charge (or the earlier one with the same `ref`).

        Raises:
          BudgetExceededError: the charge would exceed the cap; nothing is recorded.
          RelationMismatchError: `relation` cannot be converted to the scope's.
          UnsupportedEventError: the scope's accountant cannot compose `event`.
          ValueError: an invalid event or parameter, or `ref` reused for another event.
        """
        return self.charge_all(
            tenant,
            dataset,
            [(stage, event, description)],
            relation=relation,
            delta=delta,
            ref=ref,
            _single=True,
        )[0]

    def charge_all(
        self,
        tenant: str,
        dataset: str,
        items: Sequence[tuple[str, dp_event.DpEvent, str]],
        *,
        relation: events.NeighboringRelation | str,
        delta: float | None = None,
        ref: str | None = None,
        documents: tuple[Sequence[str], float]
        | Callable[[Connection], tuple[Sequence[str], float]]
        | None = None,
        event_shape: str | None = None,
        _single: bool = False,
    ) -> list[Charge]:
        """Records one release's charges, one row per stage, atomically: all or none.

        Args:
          tenant: scope tenant.
          dataset: scope dataset.
          items: (stage, event, public description) per stage of the release.
          relation: the neighbouring relation of every event.
          delta: as in `charge`.
          ref: idempotency key of the whole release; row i gets ``f"{ref}/{i}"``.
          documents: (document ids, rho) of a collection in individual accounting: each
            named document pays rho in the same transaction
            (`synthgen.privacy.document_filters`), so the scope's charge and the
            documents' losses land together or not at all. Or a callable that gets the
            transaction's connection and returns them: the payers are then chosen from
            the filters' state inside the lock (no other answer can exhaust one in
            between). Required for a collection that has filters.
          event_shape: the release's repeated-event shape (`pin_event_shape`): where
            `dataset` has a collection cap, its pinned shape must be this one (pinned in
            this transaction if none is).

        Returns:
          The recorded charges (or the earlier ones with the same `ref`).

        Raises:
          BudgetExceededError: the charges together would exceed the cap, or the dataset
            shares records with a name that charged after both were bound
            (`ledger_documents.undeclared_sharing`); nothing is recorded.
          DocumentBudgetError: a named document cannot pay; nothing is recorded.
          EventShapeError: the collection cap pins another `event_shape`; nothing recorded.
          ValueError: no items, an invalid event, or `ref` reused for other events.
        """
        if not items:
            raise ValueError("charge_all needs at least one (stage, event, description)")
        relation = events.as_relation(relation)
        for _, event, _ in items:
            events.validate_event(event)
        refs = (
            [ref] if _single else [None if ref is None else f"{ref}/{i}" for i in range(len(items))]
        )
        wanted = [(events.event_to_json(e), relation.name) for _, e, _ in items]
        with self._store.scope_lock(dataset, tenant) as conn:
            if ref is not None:
                earlier = [self._find(conn, tenant, dataset, r) for r in refs]
                extra = (
                    None if _single else self._find(conn, tenant, dataset, f"{ref}/{len(items)}")
                )
                if extra is not None or any(c is not None for c in earlier):
                    if extra is not None or any(
                        c is None or (c.event, c.relation) != w for c, w in zip(earlier, wanted)
                    ):
                        noun = "charge" if _single else "charges"
                        raise ValueError(f"{ref=} already names a different {noun}")
                    return earlier
            if event_shape is not None:
                self._hold_event_shape(conn, dataset, event_shape)
            shared = undeclared_sharing(self._store, conn, dataset)
            if shared:  # two names bound before either charged: the second to charge waits
                raise BudgetExceededError(
                    f"the documents of {dataset} share records with {', '.join(shared)}, "
                    "which charged after both were bound: a charge here would add up with "
                    f"theirs. Use --dataset {shared[0]} to keep one budget, or bind again "
                    f"with {GUARANTEES_FLAG} to add up deliberately; nothing was charged",
                    tenant=tenant,
                    dataset=dataset,
                )
            stage_events = [(stage, event) for stage, event, _ in items]
            checked = self._check_scopes(conn, tenant, dataset, stage_events, relation, delta)
            standalone = checked[0][2]
            filters = DocumentFilters(self._store)
            if documents is not None:
                doc_ids, rho = documents(conn) if callable(documents) else documents
                filters.charge_in(conn, dataset, doc_ids, rho, ref)
            elif filters.record_in(conn, dataset) is not None:
                raise ValueError(
                    f"{dataset} has per-document filters: its charges must name the "
                    "documents that pay (individual accounting)"
                )
            recorded = []
            now = time.time()
            for (stage, _, description), (event_json, _), (own_eps, own_delta), row_ref in zip(
                items, wanted, standalone, refs
            ):
                values = (
                    tenant,
                    dataset,
                    stage,
                    own_eps,
                    own_delta,
                    event_json,
                    description,
                    now,
                    relation.name,
                    row_ref,
                )
                row = conn.execute(
                    "INSERT INTO charges (tenant, dataset, stage, epsilon, delta, event,"
                    " description, created_at, relation, ref)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    values,
                ).fetchone()
                recorded.append(Charge(int(row[0]), *values))
        # Committed: the summaries that were checked now describe the recorded rows.
        for scope, summary, _ in checked:
            self._remember(scope, dataclasses.replace(summary, last_id=recorded[-1].id), now)
        return recorded

    def check(
        self,
        tenant: str,
        dataset: str,
        *,
        stage: str,
        event: dp_event.DpEvent,
        relation: events.NeighboringRelation | str,
        delta: float | None = None,
    ) -> tuple[float, float]:
        """Dry run of `charge`: raises as `charge` would, records nothing.

        Lets a stage refuse before any expensive work (loading a model); the stage still
        calls `charge` right before its release, which re-checks atomically.

        Returns:
          (epsilon, delta) of the event on its own, in the scope's relation.
        """
        relation = events.as_relation(relation)
        events.validate_event(event)
        with self._store.read() as conn:
            checked = self._check_scopes(conn, tenant, dataset, [(stage, event)], relation, delta)
        return checked[0][2][0]

    def repeats_that_fit(
        self,
        tenant: str,
        dataset: str,
        stage_events: Sequence[tuple[str, dp_event.DpEvent]],
        *,
        relation: events.NeighboringRelation | str,
        delta: float | None = None,
        limit: int = 100,
    ) -> int:
        """How many more times `charge_all(stage_events)` would pass, at most `limit`.

        The ledger's own admission rule applied to n copies of the same charge (e.g. one
        answer's stages) after the scope's current record, for the tenant's scope and the
        dataset's collection scope: what a client may still ask for, as the server will
        decide it (composition makes this more than remaining epsilon / epsilon). Read-only.

        Raises:
          KeyError: the tenant has no scope on the dataset.
        """
        relation = events.as_relation(relation)
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit=}")
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta=}")
        if not stage_events:
            raise ValueError("stage_events must not be empty")
        for _, event in stage_events:
            events.validate_event(event)
        fits, figures = limit, None
        with self._store.read() as conn:
            names = [tenant]
            if tenant != COLLECTION and self._scope(conn, COLLECTION, dataset) is not None:
                names.append(COLLECTION)
            for name in names:
                scope = self._stored_scope(conn, name, dataset)
                summary = self._summary(conn, scope)
                prepared = self._prepared(scope, stage_events, relation, delta, figures)
                figures = figures or [own for _, own in prepared]  # as the rows record them
                count = 0
                while count < fits:
                    for event_json, own in prepared:
                        summary = summary.extended(event_json, own)
                    if not _within(scope, *summary.spend(scope.delta_cap)):
                        break
                    count += 1
                fits = count
        return fits

    def find_charge(self, tenant: str, dataset: str, ref: str) -> Charge | None:
        """The charge of the scope recorded with idempotency key `ref`, if any."""
        with self._store.read() as conn:
            return self._find(conn, tenant, dataset, ref)

    @staticmethod
    def _find(conn: Connection, tenant: str, dataset: str, ref: str) -> Charge | None:
        row = conn.execute(
            f"SELECT {_CHARGE_COLUMNS} FROM {_CHARGE_FROM} "
            "WHERE tenant = ? AND dataset = ? AND ref = ?",
            (tenant, dataset, ref),
        ).fetchone()
        return None if row is None else Charge(*row)

    def charges(self, tenant: str, dataset: str) -> list[Charge]:
        """All charges of a scope, oldest first (a collection scope: every tenant's)."""
        where, params = _rows_of(tenant, dataset)
        with self._store.read() as conn:
            rows = conn.execute(
                f"SELECT {_CHARGE_COLUMNS} FROM {_CHARGE_FROM} WHERE {where} ORDER BY id", params
            ).fetchall()
        return [Charge(*row) for row in rows]

    def spent(self, tenant: str, dataset: str) -> Spend:
        """Composed spend of a scope under its accountant, and what remains of its cap.

        The stated spend: a function of the recorded events alone (the summary of their
        `EventTally`), the same figure in every process whatever it charged before, never
        below the exact composition (pessimistic PLD, RDP and basic bounds). A long-lived
        object's running summary, which its charge checks use, may state a little more.
        """
        with self._store.read() as conn:
            scope = self._stored_scope(conn, tenant, dataset)
            summary = self._stated_summary(conn, scope)[0]
        eps, delta = summary.spend(scope.delta_cap)
        return Spend(
            epsilon=eps,
            delta=delta,
            epsilon_remaining=max(0.0, scope.epsilon_cap - eps),
            delta_remaining=(
                max(0.0, scope.delta_cap - delta) if scope.accountant == "basic" else None
            ),
            num_charges=summary.num_events,
        )

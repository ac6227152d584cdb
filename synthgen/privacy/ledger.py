"""Persistent privacy budget ledger: one (epsilon, delta) cap per scope, charged before release.

A scope is a (tenant, dataset) pair with a neighbouring relation (its privacy unit). Each
charge records the stage that spent it, its DpEvent (JSON), the relation under which that
event is analysed, its standalone (epsilon, delta) in the scope's relation, a free-form
description (never private data), an optional idempotency reference and the time. What a
scope has spent is the composition of all its events under the scope's accountant, stated
at the scope's delta cap:

  * ``pld`` / ``rdp``: dp-accounting composition of the recorded events (tight);
  * ``basic``: sum of the standalone epsilons and deltas (for events no accountant models).

Every event is validated before it reaches the ledger (`accounting.validate_event`:
epsilon >= 0 and finite, 0 <= delta < 1, sigma > 0, 0 < q <= 1). An event analysed under
another relation than its scope's is converted soundly (add/remove-one to replace-one, see
`accounting.convert_relation`) or refused with `RelationMismatchError`.

A charge that would push the composition past the cap raises `BudgetExceededError` and
records nothing; callers draw noise only after `charge` returns. SQLite with
``BEGIN IMMEDIATE`` serialises concurrent charges from threads and processes, so the check
and the insert are one atomic step and the cap is never overspent.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from dp_accounting import dp_event

from synthgen.privacy import accounting
from synthgen.privacy.errors import BudgetExceededError, PrivacyError, UnsupportedEventError

LedgerAccountant = Literal["pld", "rdp", "basic"]
LEDGER_ACCOUNTANTS = ("pld", "rdp", "basic")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS scopes (
  tenant TEXT NOT NULL, dataset TEXT NOT NULL,
  epsilon_cap REAL NOT NULL, delta_cap REAL NOT NULL,
  accountant TEXT NOT NULL, relation TEXT NOT NULL, created_at REAL NOT NULL,
  PRIMARY KEY (tenant, dataset));
CREATE TABLE IF NOT EXISTS charges (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant TEXT NOT NULL, dataset TEXT NOT NULL, stage TEXT NOT NULL,
  epsilon REAL NOT NULL, delta REAL NOT NULL, event TEXT NOT NULL,
  description TEXT NOT NULL, created_at REAL NOT NULL,
  relation TEXT, ref TEXT,
  FOREIGN KEY (tenant, dataset) REFERENCES scopes (tenant, dataset));
"""
# Ledgers written before charges carried their relation: their events were evaluated under
# the scope's relation, which is what a NULL relation keeps meaning.
_MIGRATIONS = (
    "ALTER TABLE charges ADD COLUMN relation TEXT",
    "ALTER TABLE charges ADD COLUMN ref TEXT",
)
_INDEX = (
    "CREATE UNIQUE INDEX IF NOT EXISTS charges_ref ON charges (tenant, dataset, ref) "
    "WHERE ref IS NOT NULL"
)
_CHARGE_COLUMNS = (
    "id, tenant, dataset, stage, epsilon, delta, event, description, charges.created_at, "
    "COALESCE(charges.relation, scopes.relation), ref"
)
_CHARGE_FROM = "charges JOIN scopes USING (tenant, dataset)"


@dataclasses.dataclass(frozen=True)
class Scope:
    """Who spends (tenant) on which private data (dataset), with its cap and accountant."""

    tenant: str
    dataset: str
    epsilon_cap: float
    delta_cap: float
    accountant: LedgerAccountant = "pld"
    relation: str = "ADD_OR_REMOVE_ONE"

    def __post_init__(self) -> None:
        if not self.tenant or not self.dataset:
            raise ValueError(f"tenant and dataset must be non-empty, got {self.tenant=!r}")
        if not (math.isfinite(self.epsilon_cap) and self.epsilon_cap > 0):
            raise ValueError(f"epsilon_cap must be positive, got {self.epsilon_cap=}")
        if not 0 < self.delta_cap < 1:
            raise ValueError(f"delta_cap must be in (0, 1), got {self.delta_cap=}")
        if self.accountant not in LEDGER_ACCOUNTANTS:
            raise ValueError(
                f"accountant must be one of {LEDGER_ACCOUNTANTS}, got {self.accountant=}"
            )
        if self.relation not in accounting.NeighboringRelation.__members__:
            raise ValueError(f"unknown neighbouring relation {self.relation=}")


@dataclasses.dataclass(frozen=True)
class Charge:
    """One recorded spend."""

    id: int
    tenant: str
    dataset: str
    stage: str
    epsilon: float
    delta: float
    event: str
    description: str
    created_at: float
    relation: str = "ADD_OR_REMOVE_ONE"
    ref: str | None = None


@dataclasses.dataclass(frozen=True)
class Spend:
    """Spent and remaining budget of a scope.

    Under ``pld``/``rdp`` the spend is the statement (epsilon, delta_cap) of the composition,
    so `delta` is the cap and `delta_remaining` is None; under ``basic`` both are sums.
    """

    epsilon: float
    delta: float
    epsilon_remaining: float
    delta_remaining: float | None
    num_charges: int


class PrivacyLedger:
    """SQLite-backed budget ledger shared by every DP stage of the project.

    Args:
      path: SQLite file; created if missing. Use one file per deployment.
      timeout: seconds a charge waits for a concurrent writer before failing.
    """

    def __init__(self, path: str | Path, *, timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._timeout = timeout
        with self._write() as conn:  # one transaction: concurrent openers migrate once
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(charges)")}
            for statement in _MIGRATIONS:
                if statement.split()[-2] not in columns:
                    conn.execute(statement)
            conn.execute(_INDEX)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # ---- scopes -----------------------------------------------------------------------

    def open_scope(self, scope: Scope) -> Scope:
        """Creates `scope`, or checks that the stored one has the same cap and accountant."""
        with self._write() as conn:
            stored = self._scope(conn, scope.tenant, scope.dataset)
            if stored is None:
                conn.execute(
                    "INSERT INTO scopes VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        scope.tenant,
                        scope.dataset,
                        scope.epsilon_cap,
                        scope.delta_cap,
                        scope.accountant,
                        scope.relation,
                        time.time(),
                    ),
                )
                return scope
        if stored != scope:
            raise ValueError(
                f"scope ({scope.tenant}, {scope.dataset}) exists with a different cap or "
                f"accountant: stored={stored}"
            )
        return stored

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
        with self._connect() as conn:
            scope = self._scope(conn, tenant, dataset)
        if scope is None:
            raise KeyError(f"no ledger scope for {tenant=}, {dataset=}")
        return scope

    def scopes(self) -> list[Scope]:
        """All scopes in the ledger."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT tenant, dataset, epsilon_cap, delta_cap, accountant, relation FROM scopes"
            ).fetchall()
        return [Scope(*row) for row in rows]

    @staticmethod
    def _scope(conn: sqlite3.Connection, tenant: str, dataset: str) -> Scope | None:
        row = conn.execute(
            "SELECT tenant, dataset, epsilon_cap, delta_cap, accountant, relation FROM scopes "
            "WHERE tenant = ? AND dataset = ?",
            (tenant, dataset),
        ).fetchone()
        return None if row is None else Scope(*row)

    # ---- charges ----------------------------------------------------------------------

    def charge(
        self,
        tenant: str,
        dataset: str,
        *,
        stage: str,
        event: dp_event.DpEvent,
        relation: accounting.NeighboringRelation | str,
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
        relation = accounting.as_relation(relation)
        accounting.validate_event(event)
        event_json = accounting.event_to_json(event)
        with self._write() as conn:
            if ref is not None:
                earlier = self._find(conn, tenant, dataset, ref)
                if earlier is not None:
                    if (earlier.event, earlier.relation) != (event_json, relation.name):
                        raise ValueError(f"{ref=} already names a different charge")
                    return earlier
            own_eps, own_delta = self._check(conn, tenant, dataset, stage, event, relation, delta)
            values = (
                tenant,
                dataset,
                stage,
                own_eps,
                own_delta,
                event_json,
                description,
                time.time(),
                relation.name,
                ref,
            )
            cursor = conn.execute(
                "INSERT INTO charges (tenant, dataset, stage, epsilon, delta, event, description,"
                " created_at, relation, ref) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            return Charge(cursor.lastrowid, *values)

    def charge_all(
        self,
        tenant: str,
        dataset: str,
        items: Sequence[tuple[str, dp_event.DpEvent, str]],
        *,
        relation: accounting.NeighboringRelation | str,
        delta: float | None = None,
        ref: str | None = None,
    ) -> list[Charge]:
        """Records one release's charges, one row per stage, atomically: all or none.

        Args:
          tenant: scope tenant.
          dataset: scope dataset.
          items: (stage, event, public description) per stage of the release.
          relation: the neighbouring relation of every event.
          delta: as in `charge`.
          ref: idempotency key of the whole release; row i gets ``f"{ref}/{i}"``.

        Returns:
          The recorded charges (or the earlier ones with the same `ref`).

        Raises:
          BudgetExceededError: the charges together would exceed the cap; nothing is recorded.
          ValueError: no items, an invalid event, or `ref` reused for other events.
        """
        if not items:
            raise ValueError("charge_all needs at least one (stage, event, description)")
        relation = accounting.as_relation(relation)
        for _, event, _ in items:
            accounting.validate_event(event)
        with self._write() as conn:
            if ref is not None:
                earlier = [
                    self._find(conn, tenant, dataset, f"{ref}/{i}") for i in range(len(items))
                ]
                extra = self._find(conn, tenant, dataset, f"{ref}/{len(items)}")
                if extra is not None or any(c is not None for c in earlier):
                    wanted = [(accounting.event_to_json(e), relation.name) for _, e, _ in items]
                    if extra is not None or any(
                        c is None or (c.event, c.relation) != w for c, w in zip(earlier, wanted)
                    ):
                        raise ValueError(f"{ref=} already names different charges")
                    return earlier
            stage_events = [(stage, event) for stage, event, _ in items]
            standalone = self._check_all(conn, tenant, dataset, stage_events, relation, delta)
            recorded = []
            now = time.time()
            for i, ((stage, event, description), (own_eps, own_delta)) in enumerate(
                zip(items, standalone)
            ):
                values = (
                    tenant,
                    dataset,
                    stage,
                    own_eps,
                    own_delta,
                    accounting.event_to_json(event),
                    description,
                    now,
                    relation.name,
                    None if ref is None else f"{ref}/{i}",
                )
                cursor = conn.execute(
                    "INSERT INTO charges (tenant, dataset, stage, epsilon, delta, event,"
                    " description, created_at, relation, ref)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    values,
                )
                recorded.append(Charge(cursor.lastrowid, *values))
            return recorded

    def check(
        self,
        tenant: str,
        dataset: str,
        *,
        stage: str,
        event: dp_event.DpEvent,
        relation: accounting.NeighboringRelation | str,
        delta: float | None = None,
    ) -> tuple[float, float]:
        """Dry run of `charge`: raises as `charge` would, records nothing.

        Lets a stage refuse before any expensive work (loading a model); the stage still
        calls `charge` right before its release, which re-checks atomically.

        Returns:
          (epsilon, delta) of the event on its own, in the scope's relation.
        """
        relation = accounting.as_relation(relation)
        accounting.validate_event(event)
        with self._connect() as conn:
            return self._check(conn, tenant, dataset, stage, event, relation, delta)

    def find_charge(self, tenant: str, dataset: str, ref: str) -> Charge | None:
        """The charge of the scope recorded with idempotency key `ref`, if any."""
        with self._connect() as conn:
            return self._find(conn, tenant, dataset, ref)

    @staticmethod
    def _find(conn, tenant: str, dataset: str, ref: str) -> Charge | None:
        row = conn.execute(
            f"SELECT {_CHARGE_COLUMNS} FROM {_CHARGE_FROM} "
            "WHERE tenant = ? AND dataset = ? AND ref = ?",
            (tenant, dataset, ref),
        ).fetchone()
        return None if row is None else Charge(*row)

    def _check(self, conn, tenant, dataset, stage, event, relation, delta) -> tuple[float, float]:
        """Standalone (epsilon, delta) of `event`; BudgetExceededError if the scope's
        composed spend with it would pass the cap."""
        return self._check_all(conn, tenant, dataset, [(stage, event)], relation, delta)[0]

    def _check_all(
        self, conn, tenant, dataset, stage_events, relation, delta
    ) -> list[tuple[float, float]]:
        """Standalone (epsilon, delta) of each new event; BudgetExceededError if the scope's
        composed spend with all of them would pass the cap."""
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta=}")
        scope = self._scope(conn, tenant, dataset)
        if scope is None:
            raise KeyError(f"no ledger scope for {tenant=}, {dataset=}; open it first")
        previous = [
            (row[0], row[1], row[2], row[3])
            for row in conn.execute(
                f"SELECT event, epsilon, delta, COALESCE(charges.relation, scopes.relation) "
                f"FROM {_CHARGE_FROM} WHERE tenant = ? AND dataset = ?",
                (tenant, dataset),
            )
        ]
        standalone, new = [], []
        for _, event in stage_events:
            event = accounting.convert_relation(event, relation, scope.relation)
            own_eps, own_delta = self._standalone(scope, event, delta)
            standalone.append((own_eps, own_delta))
            new.append((accounting.event_to_json(event), own_eps, own_delta, scope.relation))
        total_eps, total_delta = self._compose(scope, previous + new)
        within = total_eps <= scope.epsilon_cap * (1 + 1e-9) and total_delta <= scope.delta_cap
        if not within:  # fails closed on NaN as well
            stages = "+".join(stage for stage, _ in stage_events)
            raise BudgetExceededError(
                f"charge refused for ({tenant}, {dataset}) stage={stages}: spend would be "
                f"epsilon={total_eps:.4g}, delta={total_delta:.3g} over cap "
                f"epsilon={scope.epsilon_cap:g}, delta={scope.delta_cap:g}"
            )
        return standalone

    def charges(self, tenant: str, dataset: str) -> list[Charge]:
        """All charges of a scope, oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT {_CHARGE_COLUMNS} FROM {_CHARGE_FROM} "
                "WHERE tenant = ? AND dataset = ? ORDER BY id",
                (tenant, dataset),
            ).fetchall()
        return [Charge(*row) for row in rows]

    def spent(self, tenant: str, dataset: str) -> Spend:
        """Composed spend of a scope under its accountant, and what remains of its cap."""
        scope = self.get_scope(tenant, dataset)
        charges = self.charges(tenant, dataset)
        eps, delta = self._compose(
            scope, [(c.event, c.epsilon, c.delta, c.relation) for c in charges]
        )
        return Spend(
            epsilon=eps,
            delta=delta,
            epsilon_remaining=max(0.0, scope.epsilon_cap - eps),
            delta_remaining=(
                max(0.0, scope.delta_cap - delta) if scope.accountant == "basic" else None
            ),
            num_charges=len(charges),
        )

    # ---- accounting -------------------------------------------------------------------

    @staticmethod
    def _relation(scope: Scope) -> accounting.NeighboringRelation:
        return accounting.NeighboringRelation[scope.relation]

    def _standalone(
        self, scope: Scope, event: dp_event.DpEvent, delta: float | None
    ) -> tuple[float, float]:
        if isinstance(event, accounting.EpsilonDeltaDpEvent):
            return event.epsilon, event.delta
        if delta is None:
            if scope.accountant == "basic":
                raise ValueError("the basic accountant needs an explicit delta for this event")
            delta = scope.delta_cap
        kind = "pld" if scope.accountant == "basic" else scope.accountant
        eps = accounting.epsilon(event, delta, accountant=kind, relation=self._relation(scope))
        return eps, delta

    def _compose(
        self, scope: Scope, records: list[tuple[str, float, float, str]]
    ) -> tuple[float, float]:
        """(epsilon at the delta cap, delta) of all records under the scope's accountant.

        Records are (event JSON, standalone epsilon, standalone delta, relation); standalone
        figures are already in the scope's relation, events are converted here.
        """
        if not records:
            return 0.0, (0.0 if scope.accountant == "basic" else scope.delta_cap)
        events = []
        for event_json, eps, delta, relation in records:
            event = accounting.restate_legacy(accounting.event_from_json(event_json))
            try:  # a stored row is re-validated: an old file may hold what is now refused
                accounting.validate_event(event)
                accounting.EpsilonDeltaDpEvent(eps, delta)
            except (ValueError, UnsupportedEventError) as exc:
                raise PrivacyError(
                    f"scope ({scope.tenant}, {scope.dataset}) holds an invalid charge ({exc}); "
                    "the ledger refuses to compose it"
                ) from None
            events.append(accounting.convert_relation(event, relation, scope.relation))
        if scope.accountant == "basic":
            return sum(r[1] for r in records), sum(r[2] for r in records)
        composed = accounting.compose(events)
        acc = accounting.make_accountant(scope.accountant, self._relation(scope))
        if not acc.supports(composed):
            raise UnsupportedEventError(
                f"the {scope.accountant} accountant of scope ({scope.tenant}, {scope.dataset}) "
                "cannot compose this event"
            )
        acc.compose(composed)
        return float(acc.get_epsilon(scope.delta_cap)), scope.delta_cap

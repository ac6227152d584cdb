"""A ledger scope's public records beyond its charges: notes and the pinned event shape.

`ScopeRecords`, a base class of `ledger.PrivacyLedger`: what a scope's guarantee also rests
on (`note_scope`) and the one event a repeated release charges (`pin_event_shape`). The
ledger never reads either; callers build them. Public text only, never private data.
"""

from __future__ import annotations

from synthgen.privacy.ledger_store import Connection
from synthgen.privacy.ledger_types import COLLECTION, EventShapeError


class ScopeRecords:
    """Notes and event shapes of a ledger's scopes (needs ``self._store``, a `LedgerStore`)."""

    def note_scope(self, tenant: str, dataset: str, note: str) -> list[str]:
        """Adds `note` to the scope's public notes (once); returns every note, oldest first.

        The notes are the scope's description of what its guarantee also rests on and the
        ledger cannot check, e.g. an operator's assertion that the encoder scoring a
        collection was not trained on it. Public text only (names, parameters; never
        private data).

        Raises:
          KeyError: no such scope.
          ValueError: an empty note or one holding a line break.
        """
        if not note.strip() or "\n" in note or "\r" in note:
            raise ValueError(f"a scope note is one non-empty line, got {note=}")
        with self._store.scope_lock(dataset) as conn:
            stored = self._record_row(conn, tenant, dataset, "notes")
            notes = stored.split("\n") if stored else []
            if note not in notes:
                notes.append(note)
                conn.execute(
                    "UPDATE scopes SET notes = ? WHERE tenant = ? AND dataset = ?",
                    ("\n".join(notes), tenant, dataset),
                )
        return notes

    def scope_notes(self, tenant: str, dataset: str) -> list[str]:
        """The scope's notes, oldest first; KeyError if it does not exist."""
        with self._store.read() as conn:
            stored = self._record_row(conn, tenant, dataset, "notes")
        return stored.split("\n") if stored else []

    def pin_event_shape(self, tenant: str, dataset: str, shape: str) -> bool:
        """Records `shape` as the scope's one repeated event, or checks the recorded one.

        The composition a scope states (PLD, RDP over many orders) assumes its events'
        parameters were fixed in advance, which a release repeated on request (every answer
        of a collection) keeps only if every caller charges the same event. The first caller
        records its event's shape (an opaque public string, compared for equality only);
        later callers must present the same.

        Returns:
          True if this call recorded the shape, False if it matched the recorded one.

        Raises:
          KeyError: no such scope.
          EventShapeError: the scope records another shape; nothing changes.
          ValueError: an empty shape.
        """
        if not shape:
            raise ValueError("an event shape is a non-empty string")
        with self._store.scope_lock(dataset) as conn:
            return self._pin_in(conn, tenant, dataset, shape)

    def _pin_in(self, conn: Connection, tenant: str, dataset: str, shape: str) -> bool:
        """`pin_event_shape` inside the caller's transaction (its dataset's lock)."""
        recorded = self._record_row(conn, tenant, dataset, "event_shape")
        if recorded is None:
            conn.execute(
                "UPDATE scopes SET event_shape = ? WHERE tenant = ? AND dataset = ?",
                (shape, tenant, dataset),
            )
            return True
        if recorded != shape:
            raise EventShapeError(tenant, dataset, recorded, shape)
        return False

    def _hold_event_shape(self, conn: Connection, dataset: str, shape: str) -> None:
        """Inside a charge's transaction: `dataset`'s collection cap, if it has one, pins
        `shape` (EventShapeError if another). It pins it now only over no earlier charge:
        earlier ones must be compared with it first (ValueError; the callers that pin
        before answering do so)."""
        capped = conn.execute(
            "SELECT event_shape FROM scopes WHERE tenant = ? AND dataset = ?",
            (COLLECTION, dataset),
        ).fetchone()
        if capped is None:
            return
        if capped[0] is None:
            earlier = conn.execute("SELECT 1 FROM charges WHERE dataset = ? LIMIT 1", (dataset,))
            if earlier.fetchone() is not None:
                raise ValueError(
                    f"{dataset} has charges but no pinned event: pin it first "
                    "(`pin_event_shape`), once its earlier charges are known to be that event"
                )
        self._pin_in(conn, COLLECTION, dataset, shape)

    def event_shape(self, tenant: str, dataset: str) -> str | None:
        """The scope's recorded event shape (None: none yet); KeyError if no such scope."""
        with self._store.read() as conn:
            return self._record_row(conn, tenant, dataset, "event_shape")

    @staticmethod
    def _record_row(conn: Connection, tenant: str, dataset: str, column: str) -> str | None:
        row = conn.execute(
            f"SELECT {column} FROM scopes WHERE tenant = ? AND dataset = ?", (tenant, dataset)
        ).fetchone()
        if row is None:
            raise KeyError(f"no ledger scope for {tenant=}, {dataset=}")
        return row[0]

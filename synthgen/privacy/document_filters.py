"""Per-document privacy filters kept in the ledger's store (SQLite or PostgreSQL).

A collection in individual mode (`synthgen.privacy.individual`) records once each
document's (epsilon, delta) target, its rho cap, the public per-answer charge and its
number of documents (``document_filters``); each charged document has its running zCDP
loss (``document_losses``) and one row per charge (``document_charges``, from which
`DocumentFilters.recompute` rebuilds the losses). A charge adds the same rho to each named
document in one transaction under the collection's lock, so concurrent answers never push
a document past its cap; it touches m rows through the primary key.

Which documents are exhausted depends on the private data: per-document figures are for
the operator; a tenant sees the summary at most (`DocumentFilters.summary`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from synthgen.privacy.errors import PrivacyError
from synthgen.privacy.individual import DocumentBudget, rho_epsilon
from synthgen.privacy.ledger_store import Connection, LedgerStore

_CHUNK = 500  # documents per IN (...) query: far below either backend's parameter limit
SUMMARY_KEYS = (
    "documents",
    "active",
    "exhausted",
    "max_epsilon",
    "median_epsilon",
    "mean_epsilon",
    "delta",
)


class DocumentBudgetError(PrivacyError):
    """Some documents of a charge cannot pay it; nothing was recorded.

    Attributes:
      dataset: the collection.
      refused: how many of the charge's documents could not pay (a count: which ones is
        private).
    """

    def __init__(self, dataset: str, refused: int) -> None:
        super().__init__(
            f"{refused} document(s) of collection {dataset!r} cannot pay this charge: "
            "exclude them and ask again"
        )
        self.dataset, self.refused = dataset, refused


@dataclasses.dataclass(frozen=True)
class DocumentFilter:
    """A collection's individual-mode record.

    Attributes:
      dataset: the collection.
      budget: each document's (epsilon, delta) target and its rho cap.
      answer_rho: the public rho one answer charges each document it touches.
      documents: the number of documents of the collection (public).
      records: which record each document id names (`PrivacyLedger.records_under_ids`;
        private, never printed); None: not pinned (filters opened before schema 11).
    """

    dataset: str
    budget: DocumentBudget
    answer_rho: float
    documents: int
    records: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.documents, int) and self.documents >= 1):
            raise ValueError(f"documents must be an integer >= 1, got {self.documents=}")
        if not 0 < self.answer_rho <= self.budget.rho_cap:
            raise ValueError(
                f"an answer's rho must be in (0, rho_cap={self.budget.rho_cap:.6g}], got "
                f"{self.answer_rho=}: not one answer would fit a document's target"
            )
        if self.budget.delta >= 1.0 / self.documents:
            raise ValueError(
                f"the document delta must be below 1/documents = {1.0 / self.documents:.3g}, "
                f"got {self.budget.delta=}"
            )

    @property
    def answers_per_document(self) -> int:
        """How many answers a document can take part in before its filter excludes it."""
        return int(self.budget.rho_cap // self.answer_rho)


def _check_documents(doc_ids: Sequence[str]) -> list[str]:
    ids = [str(d) for d in doc_ids]
    if len(set(ids)) != len(ids):
        raise ValueError("a charge names each document once")
    return ids


def _chunks(ids: list[str]):
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


class DocumentFilters:
    """The per-document filters of the collections in a ledger store.

    Args:
      store: the ledger's store (`PrivacyLedger.store`).
    """

    def __init__(self, store: LedgerStore) -> None:
        self._store = store

    def open(self, record: DocumentFilter) -> DocumentFilter:
        """Puts `record.dataset` in individual mode, once; the same record again is a no-op.

        Raises:
          ValueError: the collection is already in individual mode with other parameters.
        """
        with self._store.scope_lock(record.dataset) as conn:
            existing = self._record(conn, record.dataset)
            if existing is not None:
                _same(existing, record)
                if existing.records is None and record.records is not None:  # pinned now
                    conn.execute(
                        "UPDATE document_filters SET records = ? WHERE dataset = ?",
                        (record.records, record.dataset),
                    )
                return existing
            conn.execute(
                "INSERT INTO document_filters (dataset, epsilon, delta, rho_cap, answer_rho, "
                "documents, records, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.dataset,
                    record.budget.epsilon,
                    record.budget.delta,
                    record.budget.rho_cap,
                    record.answer_rho,
                    record.documents,
                    record.records,
                    time.time(),
                ),
            )
        return record

    def check(self, record: DocumentFilter) -> None:
        """Read-only: `open`'s refusal of other parameters, before anything is written."""
        existing = self.get(record.dataset)
        if existing is not None:
            _same(existing, record)

    def datasets(self) -> list[str]:
        """The collections in individual mode, by name."""
        with self._store.read() as conn:
            rows = conn.execute("SELECT dataset FROM document_filters ORDER BY dataset").fetchall()
        return [str(r[0]) for r in rows]

    def get(self, dataset: str) -> DocumentFilter | None:
        """The collection's individual-mode record, or None (collection accounting)."""
        with self._store.read() as conn:
            return self._record(conn, dataset)

    def record_in(self, conn: Connection, dataset: str) -> DocumentFilter | None:
        """`get` inside the caller's transaction."""
        return self._record(conn, dataset)

    def _required(self, conn: Connection, dataset: str) -> DocumentFilter:
        """`_record`; KeyError if the collection is not in individual mode."""
        record = self._record(conn, dataset)
        if record is None:
            raise KeyError(f"collection {dataset!r} has no per-document filters")
        return record

    @staticmethod
    def _record(conn: Connection, dataset: str) -> DocumentFilter | None:
        row = conn.execute(
            "SELECT epsilon, delta, rho_cap, answer_rho, documents, records "
            "FROM document_filters WHERE dataset = ?",
            (dataset,),
        ).fetchone()
        if row is None:
            return None
        epsilon, delta, stored_cap, answer_rho, documents, records = row
        budget = DocumentBudget(float(epsilon), float(delta))
        if not math.isclose(budget.rho_cap, float(stored_cap), rel_tol=1e-9):
            raise PrivacyError(
                f"collection {dataset!r}: the stored rho cap {stored_cap} is not the one its "
                f"target implies ({budget.rho_cap}); refusing to charge against it"
            )
        return DocumentFilter(dataset, budget, float(answer_rho), int(documents), records)

    @staticmethod
    def _losses(conn: Connection, dataset: str, ids: list[str]) -> dict[str, float]:
        losses: dict[str, float] = {}
        for chunk in _chunks(ids):
            marks = ", ".join("?" * len(chunk))
            rows = conn.execute(
                "SELECT doc_id, rho FROM document_losses "
                f"WHERE dataset = ? AND doc_id IN ({marks})",
                (dataset, *chunk),
            ).fetchall()
            losses.update((str(d), float(r)) for d, r in rows)
        return losses

    def losses(self, dataset: str, doc_ids: Sequence[str]) -> np.ndarray:
        """Each named document's running rho (0 for one never charged), in order."""
        ids = [str(d) for d in doc_ids]
        with self._store.read() as conn:
            spent = self._losses(conn, dataset, ids)
        return np.array([spent.get(d, 0.0) for d in ids], dtype=np.float64)

    def active(self, dataset: str, doc_ids: Sequence[str], charge_rho: float) -> np.ndarray:
        """Whether each named document's filter admits a further `charge_rho` (bool array).

        Raises:
          KeyError: the collection is not in individual mode.
        """
        with self._store.read() as conn:
            record = self._required(conn, dataset)
        return self.losses(dataset, doc_ids) + charge_rho <= record.budget.rho_cap

    def exhausted(self, dataset: str, charge_rho: float) -> list[str]:
        """The documents whose filter refuses a further `charge_rho` (operator and answer
        loop only: which documents are exhausted is private). Reads only documents near
        their cap, not the whole collection.

        Raises:
          KeyError: the collection is not in individual mode.
        """
        with self._store.read() as conn:
            return self.exhausted_in(conn, dataset, charge_rho)

    def exhausted_in(self, conn: Connection, dataset: str, charge_rho: float) -> list[str]:
        """`exhausted` inside the caller's transaction (e.g. the one that then charges the
        answer's payers, so no other answer can exhaust one in between)."""
        record = self._required(conn, dataset)
        floor = (record.budget.rho_cap - charge_rho) * (1 - 1e-9)  # fits() decides below
        rows = conn.execute(
            "SELECT doc_id, rho FROM document_losses WHERE dataset = ? AND rho > ?",
            (dataset, floor),
        ).fetchall()
        return [str(d) for d, r in rows if not record.budget.fits(float(r), charge_rho)]

    def charge_in(
        self,
        conn: Connection,
        dataset: str,
        doc_ids: Sequence[str],
        charge_rho: float,
        ref: str | None = None,
    ) -> None:
        """Adds `charge_rho` to each named document, inside the caller's transaction.

        The caller holds the collection's lock (`LedgerStore.scope_lock(dataset)`), e.g. the
        transaction that records the answer's charge, so both land or neither does. `ref`
        (the answer's public ref) is written with each document's charge row.

        Raises:
          DocumentBudgetError: a named document cannot pay; nothing is written (the caller's
            transaction rolls back on the exception).
          KeyError: the collection is not in individual mode.
          ValueError: a repeated document, or `charge_rho` not finite and > 0.
        """
        if not (isinstance(charge_rho, int | float) and 0 < charge_rho < math.inf):
            raise ValueError(f"charge_rho must be finite and > 0, got {charge_rho=}")
        ids = _check_documents(doc_ids)
        record = self._required(conn, dataset)
        spent = self._losses(conn, dataset, ids)
        refused = sum(
            1 for d in ids if not record.budget.fits(spent.get(d, 0.0), float(charge_rho))
        )
        if refused:
            raise DocumentBudgetError(dataset, refused)
        now = time.time()
        for doc_id in ids:
            conn.execute(
                "INSERT INTO document_losses (dataset, doc_id, rho, charges) VALUES (?, ?, ?, 1) "
                "ON CONFLICT (dataset, doc_id) DO UPDATE SET "
                "rho = document_losses.rho + excluded.rho, "
                "charges = document_losses.charges + 1",
                (dataset, doc_id, float(charge_rho)),
            )
            conn.execute(
                "INSERT INTO document_charges (dataset, doc_id, rho, ref, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (dataset, doc_id, float(charge_rho), ref, now),
            )

    def charge(
        self, dataset: str, doc_ids: Sequence[str], charge_rho: float, ref: str | None = None
    ) -> None:
        """`charge_in` in a transaction of its own, under the collection's lock."""
        with self._store.scope_lock(dataset) as conn:
            self.charge_in(conn, dataset, doc_ids, charge_rho, ref)

    def recompute(self, dataset: str) -> dict[str, float]:
        """Every charged document's loss summed again from its charge rows (operator only).

        The running losses (`losses`) must equal these; `verify` compares them.
        """
        with self._store.read() as conn:
            rows = conn.execute(
                "SELECT doc_id, SUM(rho) FROM document_charges WHERE dataset = ? GROUP BY doc_id",
                (dataset,),
            ).fetchall()
        return {str(d): float(r) for d, r in rows}

    def verify(self, dataset: str, rel_tol: float = 1e-9) -> int:
        """How many documents' running losses differ from their charge rows or pass the
        collection's cap (0: sound)."""
        recomputed = self.recompute(dataset)
        with self._store.read() as conn:
            rows = conn.execute(
                "SELECT doc_id, rho FROM document_losses WHERE dataset = ?", (dataset,)
            ).fetchall()
        running = {str(d): float(r) for d, r in rows}
        cap = self.get(dataset).budget.rho_cap
        return sum(
            1
            for d in set(running) | set(recomputed)
            if not math.isclose(running.get(d, 0.0), recomputed.get(d, 0.0), rel_tol=rel_tol)
            or running.get(d, 0.0) > cap
        )

    def summary(self, dataset: str) -> dict[str, float | int]:
        """documents, active, exhausted, max / median / mean epsilon spent at the document
        delta, and delta (the keys of `SUMMARY_KEYS`).

        A document is exhausted when it cannot pay one more answer (`answer_rho`); documents
        never charged count as active with epsilon 0.

        Privacy:
          Aggregates over the collection only; which documents are exhausted, and each
          document's figure, depend on the private data and are not returned here.
        """
        with self._store.read() as conn:
            record = self._required(conn, dataset)
            rows = conn.execute(
                "SELECT rho FROM document_losses WHERE dataset = ?", (dataset,)
            ).fetchall()
        charged = np.array([float(r[0]) for r in rows], dtype=np.float64)
        never = max(record.documents - charged.size, 0)
        rho = np.concatenate([charged, np.zeros(never)])
        values, counts = np.unique(rho, return_counts=True)
        epsilons = np.array([rho_epsilon(float(v), record.budget.delta) for v in values])
        per_document = np.repeat(epsilons, counts)  # sorted, as np.unique sorts
        exhausted = int(np.sum(rho + record.answer_rho > record.budget.rho_cap))
        return {
            "documents": int(rho.size),
            "active": int(rho.size - exhausted),
            "exhausted": exhausted,
            "max_epsilon": float(per_document.max()),
            "median_epsilon": float(np.median(per_document)),
            "mean_epsilon": float(per_document.mean()),
            "delta": record.budget.delta,
        }


def _same(existing: DocumentFilter, record: DocumentFilter) -> DocumentFilter:
    """`existing`, or ValueError: per-document filters never change, nor do the records
    their ids name (new ids for the same records would start fresh filters): a caller that
    names no records is refused by pinned filters."""
    if existing != record:
        raise ValueError(
            f"collection {record.dataset!r} already has per-document filters {existing}; "
            "they never change (use another collection name)"
        )
    if existing.records is not None and record.records is None:
        raise ValueError(
            f"collection {record.dataset!r}'s per-document filters are kept by document id: "
            "name its records (doc_ids and texts) to use them"
        )
    if existing.records is not None and existing.records != record.records:
        raise ValueError(
            f"collection {record.dataset!r}'s per-document filters are kept by document id, "
            "and these ids name other records than when they opened (renumbered or edited "
            "records would each start a fresh filter): restore its doc_ids and texts"
        )
    return existing

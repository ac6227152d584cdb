"""Moves a privacy ledger between backends (SQLite <-> PostgreSQL), checked charge by charge.

The record is copied as it is: every scope with its cap, accountant, relation, creation
time, notes and pinned event shape, the records each collection name guards with the secret
keys of their digests and the names found to share records, with whether each pair was
admitted deliberately (`ledger_documents`), every charge in id order with its stage,
standalone figures, event JSON, description, time, relation and idempotency reference.
Charges are not re-checked against caps (they were when first recorded). The target must not
hold any of the copied scopes yet, nor, when the source binds records, records of its own
(their digests are keyed by another secret: names over the same documents in the two ledgers
could not be grouped). After the copy, both ledgers are read back and compared row by row,
and each scope's stated spend is recomputed on the target.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from synthgen.privacy.ledger import PrivacyLedger


@dataclasses.dataclass(frozen=True)
class CopyReport:
    """What a copy moved: scopes, charges, and each scope's spend on both sides."""

    scopes: int
    charges: int
    spends: dict[str, tuple[float, float]]  # "tenant/dataset": (source, target) epsilon


# Every table a copy moves, in the order it inserts them: (columns, ORDER BY, whether an
# existing row is left alone). Binding tables (`ledger_documents`) are copied as they are.
_TABLES = {
    "scopes": (
        "tenant, dataset, epsilon_cap, delta_cap, accountant, relation, created_at, notes, "
        "event_shape",
        " ORDER BY created_at, tenant, dataset",
        False,
    ),
    "document_sets": ("dataset, fingerprint, documents, created_at", " ORDER BY created_at", True),
    "ledger_keys": ("key_id, secret, created_at", "", True),
    "document_records": ("dataset, key_id, digest", "", True),
    "document_links": ("dataset, other, created_at, deliberate", "", True),
    "charges": (
        "tenant, dataset, stage, epsilon, delta, event, description, created_at, relation, ref",
        " ORDER BY id",
        False,
    ),
}
_BINDING_TABLES = ("ledger_keys", "document_records", "document_links")


def copy_ledger(source: str | Path, target: str | Path) -> CopyReport:
    """Copies every scope and charge of ledger `source` into ledger `target`.

    Args:
      source, target: ledger locations (file path, ``sqlite:///...``, ``postgresql://...``).

    Returns:
      A `CopyReport`.

    Raises:
      ValueError: `target` already holds one of the scopes (or record bindings, when the
        source has some), a copied row differs, or the source has per-document filters
        (individual mode), which are not copied yet.
    """
    src, dst = PrivacyLedger(source), PrivacyLedger(target)
    if src.location == dst.location:
        raise ValueError("source and target are the same ledger")
    scopes = src.scopes()
    # Whole datasets only: a target scope beside copied charges (a collection cap above
    # all, or a tenant's charges interleaved) would be checked by no one during the copy.
    existing = {s.dataset for s in dst.scopes()}
    clash = sorted({f"*/{s.dataset}" for s in scopes if s.dataset in existing})
    if clash:
        raise ValueError(
            f"the target ledger already holds scopes on datasets {clash}; copy into a new one"
        )
    with src._store.read() as conn:  # noqa: SLF001 - the copy speaks the stores' schema
        individual = conn.execute("SELECT COUNT(*) FROM document_filters").fetchone()[0]
        if individual:
            # A copy without the per-document losses would let documents pay twice.
            raise ValueError(
                f"the source ledger holds {individual} collection(s) with per-document "
                "filters, which copy_ledger does not move yet; nothing was copied"
            )
        rows = {
            table: conn.execute(f"SELECT {columns} FROM {table}{order}").fetchall()
            for table, (columns, order, _) in _TABLES.items()
        }
    with dst._store.write() as conn:  # noqa: SLF001 - one transaction: all or nothing
        bound = conn.execute("SELECT 1 FROM document_sets LIMIT 1").fetchone()
        if bound and (rows["document_sets"] or rows["document_records"]):
            raise ValueError(
                "the target ledger already binds documents to collection names (under its "
                "own secret, or by whole-collection digests), so names over the same documents "
                "in the two ledgers could not be grouped: copy into a new ledger; nothing was "
                "copied"
            )
        for table, (columns, _, keep) in _TABLES.items():
            marks = ", ".join("?" * len(columns.split(", ")))
            conflict = " ON CONFLICT DO NOTHING" if keep else ""
            sql = f"INSERT INTO {table} ({columns}) VALUES ({marks}){conflict}"
            conn.executemany(sql, rows[table])
    spends = {}
    for scope in scopes:
        before = src.charges(scope.tenant, scope.dataset)
        after = dst.charges(scope.tenant, scope.dataset)
        strip = [dataclasses.replace(c, id=0) for c in before]
        if strip != [dataclasses.replace(c, id=0) for c in after]:
            raise ValueError(f"charges of {scope.tenant}/{scope.dataset} differ after the copy")
        if dst.get_scope(scope.tenant, scope.dataset) != scope:
            raise ValueError(f"scope {scope.tenant}/{scope.dataset} differs after the copy")
        for read in ("scope_notes", "event_shape"):
            if getattr(src, read)(scope.tenant, scope.dataset) != getattr(dst, read)(
                scope.tenant, scope.dataset
            ):
                raise ValueError(f"{read} of {scope.tenant}/{scope.dataset} differ after the copy")
        a = src.spent(scope.tenant, scope.dataset).epsilon
        b = dst.spent(scope.tenant, scope.dataset).epsilon
        if not math.isclose(a, b, rel_tol=1e-6):
            raise ValueError(f"spend of {scope.tenant}/{scope.dataset} differs after the copy")
        spends[f"{scope.tenant}/{scope.dataset}"] = (a, b)
    if rows["document_sets"]:  # the target held no binding: its tables are the source's
        with src._store.read() as a, dst._store.read() as b:  # noqa: SLF001
            compared = {t: _TABLES[t][0] for t in _BINDING_TABLES}
            for table, columns in {**compared, "document_sets": "dataset, fingerprint"}.items():
                query = f"SELECT {columns} FROM {table}"
                rows_a, rows_b = (sorted(map(tuple, c.execute(query).fetchall())) for c in (a, b))
                if rows_a != rows_b:
                    raise ValueError(f"{table} differs after the copy")
    grouped = [set(g.datasets) for g in dst.document_groups()]
    for group in src.document_groups():
        if not any(set(group.datasets) <= names for names in grouped):
            raise ValueError(f"the names {group.datasets} are not grouped after the copy")
    src.close()
    dst.close()
    return CopyReport(len(scopes), len(rows["charges"]), spends)

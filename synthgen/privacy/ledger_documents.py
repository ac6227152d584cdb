"""Which documents a ledger's collection names guard: fingerprints, groups, composed totals.

A ledger composes the charges recorded under one collection name. Two names over the same
documents are two budgets for one set of people: each states its own guarantee, and what
the documents have lost is the composition of both. So the ledger also knows the data, not
only its name: every entry point that charges a collection binds the name to a fingerprint
of its documents (`documents_fingerprint`, `DocumentSets.bind_documents`) before its first
charge, and

  * a name bound to documents that another name already guards is refused unless the
    caller asks for it deliberately (``guarantees_add_up=True``, on the command line
    ``--guarantees-add-up``): the refusal names the other names and how to keep one budget;
  * `document_groups` gathers the names that share documents (directly or through a third
    name), and `group_spend` composes every charge of every name of a group: what
    ``synthgen ledger show`` and ``retriever tenant list`` print beside the names.

The fingerprint is the SHA-256 of the sorted SHA-256 digests of the documents' texts: the
same multiset of documents gives the same fingerprint whatever their order or file. A
collection that differs by one document has another fingerprint; the names are then not
grouped (the ledger keeps no per-document digest, which would let anyone who reads it test
whether a given text is in the collection).

Privacy:
  The fingerprint is a digest of the private documents: whoever knows every document but
  one could test candidates for the last one against it. It stays in the ledger (the
  operator's private state, like its per-document losses and key hashes) and is never
  printed, logged, put in an error or written into a released artefact; what leaves the
  ledger is the names, the number of documents and the composed figures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Iterable, Mapping

from synthgen.privacy.document_filters import DocumentFilters
from synthgen.privacy.errors import PrivacyError, UnsupportedEventError
from synthgen.privacy.events import (
    EpsilonDeltaDpEvent,
    convert_relation,
    event_from_json,
    event_to_json,
)
from synthgen.privacy.figures import format_epsilon
from synthgen.privacy.ledger_store import Connection
from synthgen.privacy.ledger_types import COLLECTION, Scope
from synthgen.privacy.summary import EventTally

GUARANTEES_FLAG = "--guarantees-add-up"
_LOCK_PREFIX = "documents:"  # the advisory lock that serialises binds of one fingerprint


def documents_fingerprint(texts: Iterable[str]) -> str:
    """SHA-256 (hex) of the sorted SHA-256 digests of `texts` (order-free, duplicates count).

    Raises:
      ValueError: no documents.
    """
    digests = sorted(hashlib.sha256(t.encode("utf-8")).digest() for t in texts)
    if not digests:
        raise ValueError("a collection needs at least one document to be fingerprinted")
    whole = hashlib.sha256(len(digests).to_bytes(8, "big"))
    for digest in digests:
        whole.update(digest)
    return whole.hexdigest()


class SharedDocumentsError(ValueError):
    """A new collection name over documents that other names of the ledger already guard."""

    def __init__(self, dataset: str, others: list[str]) -> None:
        names = ", ".join(others)
        keep = others[0]
        super().__init__(
            f"the documents of {dataset} are the documents that {names} already "
            f"guard{'s' if len(others) == 1 else ''} in this ledger: charging them under "
            f"another name adds its guarantee to theirs (the documents lose both). To keep "
            f"one budget, use --dataset {keep}; to add up deliberately, pass "
            f"{GUARANTEES_FLAG} (`synthgen ledger show` then prints the names together with "
            "their composed total)"
        )
        self.dataset, self.others = dataset, others


@dataclasses.dataclass(frozen=True)
class DocumentGroup:
    """Collection names that guard the same documents, and what their charges compose to.

    Attributes:
      datasets: the names, in order of first binding.
      documents: the largest number of documents bound under any of them.
      epsilon, delta: the composition of every charge of every name (`group_spend`),
        stated at delta = the sum of the names' largest delta caps (at most 1/2); infinite
        when neither PLD nor RDP composes the events.
    """

    datasets: tuple[str, ...]
    documents: int
    epsilon: float
    delta: float

    def to_json(self) -> dict:
        """What ``ledger show --json`` and ``tenant list --json`` print (never the
        fingerprint): the names, n, the composed figures and the line people read."""
        return {
            "kind": "same_documents",
            "same_documents": list(self.datasets),
            "documents": self.documents,
            "epsilon_spent": self.epsilon,
            "epsilon_spent_text": format_epsilon(self.epsilon),
            "delta": self.delta,
            "line": (
                f"same {self.documents} documents under {len(self.datasets)} names "
                f"({', '.join(self.datasets)}): their guarantees add up to epsilon "
                f"{format_epsilon(self.epsilon)} at delta={self.delta:g} (every charge of "
                "every name composed)"
            ),
        }


class DocumentSets:
    """The fingerprints of a ledger's collections (a base class of `ledger.PrivacyLedger`;
    needs ``self._store`` and the ledger's `_row_record`)."""

    def bind_documents(
        self, dataset: str, fingerprint: str, documents: int, *, guarantees_add_up: bool = False
    ) -> list[str]:
        """Records that `dataset` guards the documents of `fingerprint`, before its charges.

        Binding the same pair again is a no-op. A name may guard several fingerprints (a
        collection that changed): its charges then bound the documents of each.

        Args:
          dataset: the collection's name in the ledger.
          fingerprint: `documents_fingerprint` of its documents.
          documents: n, their number (public, as every delta bound needs it).
          guarantees_add_up: the caller knows other names guard these documents and wants
            the guarantees to add up (``--guarantees-add-up``).

        Returns:
          The other names bound to the same documents, in order of first binding.

        Raises:
          SharedDocumentsError: other names bound to these documents have charges (or
            per-document filters), `dataset` is not yet bound to them and
            `guarantees_add_up` is False (nothing is written). A name bound but never
            charged refuses nothing: it has spent nothing the new name would add to. Two
            new names bound at once, before either charges, are both admitted; the ledger
            still groups them and composes their total.
        """
        if documents < 1:
            raise ValueError(f"documents must be >= 1, got {documents=}")
        with self._store.scope_lock(_LOCK_PREFIX + fingerprint) as conn:
            rows = conn.execute(
                "SELECT dataset FROM document_sets WHERE fingerprint = ? ORDER BY created_at",
                (fingerprint,),
            ).fetchall()
            bound = [r[0] for r in rows]
            others = [d for d in bound if d != dataset]
            if dataset in bound and (guarantees_add_up or _has_spent(conn, dataset)):
                return others
            # a binding left by a refused run spent nothing: it admits no new name
            charged = [d for d in others if _has_spent(conn, d)]
            if charged and not guarantees_add_up:
                raise SharedDocumentsError(dataset, charged)
            if dataset in bound:
                return others
            conn.execute(
                "INSERT INTO document_sets (dataset, fingerprint, documents, created_at) "
                "VALUES (?, ?, ?, ?)",
                (dataset, fingerprint, int(documents), time.time()),
            )
        return others

    def document_groups(self) -> list[DocumentGroup]:
        """Every group of two or more names that share documents, with its composed total."""
        with self._store.read() as conn:
            rows = conn.execute(
                "SELECT dataset, fingerprint, documents FROM document_sets ORDER BY created_at"
            ).fetchall()
        parent: dict[str, str] = {}

        def root(name: str) -> str:
            while parent.setdefault(name, name) != name:
                name = parent[name]
            return name

        first: dict[str, str] = {}
        size: dict[str, int] = {}
        for dataset, fingerprint, documents in rows:
            size[dataset] = max(size.get(dataset, 0), int(documents))
            if fingerprint in first:
                a, b = root(first[fingerprint]), root(dataset)
                if a != b:
                    parent[b] = a
            else:
                first[fingerprint] = dataset
                root(dataset)
        members: dict[str, list[str]] = {}
        for dataset in dict.fromkeys(r[0] for r in rows):
            members.setdefault(root(dataset), []).append(dataset)
        return [
            self.group_spend(names, documents=max(size[d] for d in names))
            for names in members.values()
            if len(names) > 1
        ]

    def group_spend(self, datasets: list[str], *, documents: int = 0) -> DocumentGroup:
        """Composes every charge of every name in `datasets` (see `DocumentGroup`).

        Each name contributes its charges' events, except that a name in individual
        accounting contributes its per-document target in place of its answers' charges
        (stages ``rag-*``, which the filters bound) and a name with a ``basic`` scope the
        sum of its charges' standalone figures (pay-as-you-go charges are sound under basic
        composition only). Events of add/remove-one are converted to replace-one when any
        is replace-one. The total is PLD's, else RDP's, else infinite: never below what
        the names state.
        """
        filters = DocumentFilters(self._store)
        scopes = self.scopes()
        items, delta = [], 0.0  # (kind, dataset or event JSON, row or relation)
        with self._store.read() as conn:
            for dataset in datasets:
                own = [s for s in scopes if s.dataset == dataset]
                rows = conn.execute(
                    "SELECT event, epsilon, delta, COALESCE(charges.relation, scopes.relation), "
                    "stage FROM charges JOIN scopes USING (tenant, dataset) WHERE dataset = ? "
                    "ORDER BY charges.id",
                    (dataset,),
                ).fetchall()
                record = filters.get(dataset)
                if record is not None:  # each document's filter bounds all its answers
                    budget = record.budget
                    event = EpsilonDeltaDpEvent(budget.epsilon, budget.delta)
                    items.append(("event", event_to_json(event), "ADD_OR_REMOVE_ONE"))
                    rows = [r for r in rows if not str(r[4]).startswith("rag-")]
                    delta += budget.delta
                basic = [s for s in own if s.accountant == "basic"]
                if basic and rows:
                    eps, dlt = sum(r[1] for r in rows), sum(r[2] for r in rows)
                    event = EpsilonDeltaDpEvent(min(eps, 1e6), min(dlt, 1 - 1e-12))
                    items.append(("event", event_to_json(event), basic[0].relation))
                    rows = []
                delta += max((s.delta_cap for s in own), default=0.0)
                items.extend(("row", dataset, tuple(r[:4])) for r in rows)
        relations = {i[2][3] if i[0] == "row" else i[2] for i in items}
        relation = "ADD_OR_REMOVE_ONE" if relations <= {"ADD_OR_REMOVE_ONE"} else "REPLACE_ONE"
        delta = min(delta, 0.5)
        try:
            tally = EventTally().added(self._group_records(items, relation))
        except (PrivacyError, ValueError):
            return DocumentGroup(tuple(datasets), documents, math.inf, delta)
        epsilon = 0.0 if not tally.num_events else math.inf
        for accountant in ("pld", "rdp") if tally.num_events else ():
            try:
                epsilon = tally.summary(accountant, relation).epsilon(delta)
                break
            except (UnsupportedEventError, ValueError):
                continue
        return DocumentGroup(tuple(datasets), documents, float(epsilon), float(delta))

    def _group_records(self, items: list, relation: str) -> list[tuple[str, tuple]]:
        """(event JSON in `relation`, standalone figures) of the group's events and rows."""
        out = []
        for kind, head, rest in items:
            if kind == "event":  # an (epsilon, delta) statement made in relation `rest`
                event = convert_relation(event_from_json(head), rest, relation)
                out.append((event_to_json(event), (0.0, 0.0)))
            else:  # a charge row of dataset `head`, converted to `relation`
                scope = Scope(COLLECTION, head, 1.0, 0.5, "pld", relation)
                out.append(self._row_record(scope, rest))
        return out


def _has_spent(conn: Connection, dataset: str) -> bool:
    """Whether `dataset` has a charge or per-document filters in the ledger."""
    return any(
        conn.execute(f"SELECT 1 FROM {table} WHERE dataset = ? LIMIT 1", (dataset,)).fetchone()
        for table in ("charges", "document_filters")
    )


_FIELD_ORDER = ("text", "document", "query", "label")


def record_text(record: str | Mapping) -> str:
    """The text a record is fingerprinted by: a string itself; a row, its non-empty values
    in the order text, document, query, label (then any other key, sorted) joined by
    U+001F. A row {"text": t, "label": ""} is t, so a corpus answered from and the same
    texts generated from are the same documents; callers name a row's fields so."""
    if isinstance(record, str):
        return record
    keys = [k for k in _FIELD_ORDER if k in record] + sorted(set(record) - set(_FIELD_ORDER))
    return "\x1f".join(str(record[k]) for k in keys if record[k] not in ("", None))


def bind_texts(
    ledger, dataset: str, records: list, *, guarantees_add_up: bool = False
) -> list[str]:
    """`ledger.bind_documents` of the fingerprint of `records` (texts or rows,
    `record_text`): what an entry point calls before its first charge to `dataset` (see
    the module docstring)."""
    texts = [record_text(r) for r in records]
    return ledger.bind_documents(
        dataset, documents_fingerprint(texts), len(texts), guarantees_add_up=guarantees_add_up
    )

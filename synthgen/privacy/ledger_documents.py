"""Which documents a ledger's collection names guard: keyed record digests, groups, totals.

Every entry point that charges a collection binds its name to its records
(`DocumentSets.bind_documents`, `bind_texts`) before its first charge. A name whose records
overlap, by even one identical record, those of another name that has charged is refused
unless the caller asks for it deliberately (``--guarantees-add-up``); `document_groups`
gathers the names that share records and `group_spend` composes every charge of a group.
See docs/guides/privacy.md ("One budget per set of documents, whatever its name").

Privacy:
  Each record (`record_text`) is kept as its HMAC-SHA-256 under a secret key of the ledger
  (128 bits kept): without the secret nobody can test whether a text is in a collection.
  The secret and the digests are the operator's private state, never printed, logged, put
  in an error or a lock name, or released; what leaves the ledger is the names, their
  numbers of documents and the composed figures. Ledgers before schema 10 kept one unkeyed
  digest per whole collection (``document_sets``), still compared for equality.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence

from dp_accounting import dp_event

from synthgen.privacy.document_filters import DocumentFilters, _chunks
from synthgen.privacy.errors import PrivacyError, UnsupportedEventError
from synthgen.privacy.events import (
    EpsilonDeltaDpEvent,
    convert_relation,
    event_from_json,
    event_to_json,
)
from synthgen.privacy.figures import format_epsilon
from synthgen.privacy.ledger_store import Connection, LedgerStore
from synthgen.privacy.ledger_types import COLLECTION, Scope
from synthgen.privacy.summary import EventTally

GUARANTEES_FLAG = "--guarantees-add-up"
# The one advisory lock that serialises bindings: a constant, so nothing derived from the
# records is visible in PostgreSQL's pg_locks.
_BIND_LOCK = "(document bindings)"  # a name that only serialises more if it collides
_KEYED = "k:"  # prefix of a keyed set id in document_sets (older rows: unkeyed SHA-256)


def documents_fingerprint(texts: Iterable[str]) -> str:
    """SHA-256 (hex) of the sorted SHA-256 digests of `texts` (order-free, duplicates count):
    the unkeyed whole-collection digest of ledgers before schema 10, compared for equality
    with their bindings only (never stored by new bindings).

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


def record_digests(secret: bytes, texts: Iterable[str]) -> list[str]:
    """The distinct keyed digests of `texts`, sorted: HMAC-SHA-256 under `secret`, 128 bits
    kept (hex). Without `secret` a digest says nothing about its text."""
    return sorted(
        {hmac.new(secret, t.encode("utf-8"), hashlib.sha256).hexdigest()[:32] for t in texts}
    )


class SharedDocumentsError(ValueError):
    """A collection name whose records overlap those of names that have charged."""

    def __init__(self, dataset: str, others: list[str], *, legacy: bool = False) -> None:
        names = ", ".join(others)
        keep = others[0]
        one = len(others) == 1
        self.dataset, self.others = dataset, others
        if legacy:
            super().__init__(
                f"this ledger holds collections bound before schema 10 that have charged "
                f"({names}): it knows them by a digest of the whole collection, so it cannot "
                f"tell whether {dataset} shares records with them. Run one command on each of "
                f"them first (it binds their records), or pass {GUARANTEES_FLAG} if {dataset} "
                "is known to share none or to add up deliberately"
            )
            return
        super().__init__(
            f"the documents of {dataset} share records with {names}, which "
            f"{'has' if one else 'have'} already charged this ledger: what another name "
            f"spends on them adds up with what {names} spent (the shared documents lose "
            f"both). If {dataset} is the same collection (a record added, "
            f"removed or edited, a re-export), keep one budget with --dataset {keep}; if it "
            f"is another collection that merely shares records, give it its own name with "
            f"--dataset and pass {GUARANTEES_FLAG} to add up deliberately (`synthgen ledger "
            "show` then prints the names together with their composed total)"
        )


@dataclasses.dataclass(frozen=True)
class DocumentGroup:
    """Collection names that share records, and what their charges compose to.

    Attributes:
      datasets: the names, in order of first binding.
      documents: the largest number of documents bound under any of them.
      epsilon, delta: the composition of every charge of every name (`group_spend`), a
        bound for each shared record, stated at delta = the sum of the names' largest
        delta caps (at most 1/2) and never below what one of the names states on its own
        (its stated epsilon holds at its smaller delta, so at the group's too); infinite
        when no sound composition is known, with `why`.
      why: the reason an infinite total is infinite, in words a user reads ("" otherwise).
    """

    datasets: tuple[str, ...]
    documents: int
    epsilon: float
    delta: float
    why: str = ""

    def to_json(self) -> dict:
        """What ``ledger show --json`` and ``tenant list --json`` print (never a digest):
        the names, n, the composed figures and the line people read."""
        line = (
            f"{len(self.datasets)} names share documents ({', '.join(self.datasets)}; up to "
            f"{self.documents} documents each): their guarantees add up to epsilon "
            f"{format_epsilon(self.epsilon)} at delta={self.delta:g} for every shared "
            "document (every charge of every name composed)"
        )
        return {
            "kind": "same_documents",
            "same_documents": list(self.datasets),
            "documents": self.documents,
            "epsilon_spent": self.epsilon if math.isfinite(self.epsilon) else None,
            "epsilon_spent_text": format_epsilon(self.epsilon),
            "delta": self.delta,
            "why": self.why,
            "line": line + (f": {self.why}" if self.why else ""),
        }


class DocumentSets:
    """The records of a ledger's collections (a base class of `ledger.PrivacyLedger`; needs
    ``self._store``, the ledger's `_row_record`, `scopes` and `spent`)."""

    def bind_documents(
        self, dataset: str, texts: Sequence[str], *, guarantees_add_up: bool = False
    ) -> list[str]:
        """Records that `dataset` guards the records `texts`, before its charges.

        Binding the same records again is a no-op. A name may be bound to several
        collections (one that changed): it then guards the records of each.

        Args:
          dataset: the collection's name in the ledger.
          texts: its records' texts (`record_text`), read here only to digest them.
          guarantees_add_up: the caller knows other names share these records and wants
            the guarantees to add up (``--guarantees-add-up``): the pair is then admitted
            for good.

        Returns:
          The other names that share at least one of these records, in order of first
          binding.

        Raises:
          ValueError: no texts.
          SharedDocumentsError: names that share a record with `texts` have charges (or
            per-document filters), the sharing was not admitted deliberately before and
            `guarantees_add_up` is False; or the ledger holds charged names bound before
            schema 10, which cannot be compared record by record. Nothing is written. A
            name bound but never charged refuses nothing at binding: it has spent nothing
            the new name would add to; the first of the two to charge after the other has
            is refused then (`undeclared_sharing`, checked by every charge).
        """
        texts = list(texts)
        if not texts:
            raise ValueError("a collection needs at least one document to be bound")
        keys = self._bind_keys()
        digests = {key_id: record_digests(secret, texts) for key_id, secret in keys}
        set_id = _KEYED + keys[0][0] + ":" + _set_digest(keys[0][1], digests[keys[0][0]])
        with self._store.read() as conn:  # the slow lookups, before the lock
            mark = _bindings_mark(conn)
            sharing = None if _is_bound(conn, dataset, set_id) else _sharing(conn, digests)
        with self._store.write() as conn:
            # the sharing names' locks first, in one order, then the bindings': a first charge
            # of one of them still in its transaction is waited for, not missed
            for name in [*sorted(set(sharing or ()) - {dataset}), _BIND_LOCK]:
                self._store.lock_also(conn, name)
            rebind = _is_bound(conn, dataset, set_id)
            if rebind:  # every name that overlaps this set was linked when bound
                sharing = sorted(_linked(conn, dataset))
            elif sharing is None or _bindings_mark(conn) != mark:  # bound meanwhile
                sharing = _sharing(conn, digests)
            shared = (set(sharing) | set(_legacy_sharing(conn, texts))) - {dataset}
            order = _first_bound(conn)
            others = sorted(shared, key=lambda d: order.get(d, math.inf))
            admitted = _deliberate(conn, dataset) if _has_spent(conn, dataset) else set()
            # a binding left by a refused run spent nothing: it admits no new name
            refused = [d for d in others if d not in admitted and _has_spent(conn, d)]
            if refused and not guarantees_add_up:
                raise SharedDocumentsError(dataset, refused)
            legacy = [d for d in _legacy_charged(conn) if d != dataset and d not in shared]
            if legacy and not guarantees_add_up:
                raise SharedDocumentsError(dataset, legacy, legacy=True)
            now = time.time()
            if not rebind:
                own_key = keys[0][0]
                conn.executemany(
                    "INSERT INTO document_records (dataset, key_id, digest) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    [(dataset, own_key, d) for d in digests[own_key]],
                )
                conn.execute(
                    "INSERT INTO document_sets (dataset, fingerprint, documents, created_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (dataset, set_id, len(texts), now),  # records, duplicates included
                )
            pairs = [(a, b) for other in others for a, b in ((dataset, other), (other, dataset))]
            conn.executemany(
                "INSERT INTO document_links (dataset, other, created_at, deliberate) "
                "VALUES (?, ?, ?, 0) ON CONFLICT DO NOTHING",
                [(a, b, now) for a, b in pairs],
            )
            if guarantees_add_up:
                conn.executemany(
                    "UPDATE document_links SET deliberate = 1 WHERE dataset = ? AND other = ?",
                    pairs,
                )
        return others

    def records_under_ids(
        self, doc_ids: Sequence[str], texts: Sequence[str], *, read_only: bool = False
    ) -> str | None:
        """A keyed digest of which record each document id names (private state, never
        printed): per-document filters are kept by id, so they pin this digest.

        `read_only`: None rather than making the ledger's first key (no filters can have
        pinned a digest before it exists).
        """
        if len(doc_ids) != len(texts):
            raise ValueError(f"one id per record: {len(doc_ids)=}, {len(texts)=}")
        if read_only:
            with self._store.read() as conn:
                keys = _read_keys(conn)
            if not keys:
                return None
        key_id, secret = (keys if read_only else self._bind_keys())[0]
        whole = hmac.new(secret, len(texts).to_bytes(8, "big"), hashlib.sha256)
        for doc_id, text in sorted(zip(map(str, doc_ids), texts, strict=True)):
            for part in (doc_id, text):
                data = part.encode("utf-8")
                whole.update(len(data).to_bytes(8, "big") + data)
        return f"{key_id}:{whole.hexdigest()}"

    def _bind_keys(self) -> list[tuple[str, bytes]]:
        """The ledger's HMAC keys, the first made (under the bind lock) if none."""
        with self._store.read() as conn:
            keys = _read_keys(conn)
        if keys:
            return keys
        with self._store.scope_lock(_BIND_LOCK) as conn:
            return _ledger_keys(conn)

    def document_groups(self) -> list[DocumentGroup]:
        """Every group of two or more names that share records, with its composed total."""
        with self._store.read() as conn:
            rows = conn.execute(
                "SELECT dataset, fingerprint, documents FROM document_sets ORDER BY created_at"
            ).fetchall()
            links = conn.execute("SELECT dataset, other FROM document_links").fetchall()
        parent: dict[str, str] = {}

        def root(name: str) -> str:
            while parent.setdefault(name, name) != name:
                name = parent[name]
            return name

        def join(a: str, b: str) -> None:
            a, b = root(a), root(b)
            if a != b:
                parent[b] = a

        first: dict[str, str] = {}
        size: dict[str, int] = {}
        for dataset, fingerprint, documents in rows:
            size[dataset] = max(size.get(dataset, 0), int(documents))
            join(first.setdefault(fingerprint, dataset), dataset)
        for dataset, other in links:
            join(dataset, other)
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
                    "stage, scopes.relation FROM charges JOIN scopes USING (tenant, dataset) "
                    "WHERE dataset = ? ORDER BY charges.id",
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
                    # each row's standalone figures are in its scope's relation: summed in
                    # replace-one when any is (add/remove-one figures by group privacy)
                    target = max(r[5] for r in rows)  # "REPLACE_ONE" > "ADD_OR_REMOVE_ONE"
                    figures = [_in_relation(r[1], r[2], r[5], target) for r in rows]
                    eps, dlt = sum(f[0] for f in figures), sum(f[1] for f in figures)
                    event = EpsilonDeltaDpEvent(min(eps, 1e6), min(dlt, 1 - 1e-12))
                    items.append(("event", event_to_json(event), target))
                    rows = []
                delta += max((s.delta_cap for s in own), default=0.0)
                items.extend(("row", dataset, tuple(r[:4])) for r in rows)
        relations = {i[2][3] if i[0] == "row" else i[2] for i in items}
        relation = "ADD_OR_REMOVE_ONE" if relations <= {"ADD_OR_REMOVE_ONE"} else "REPLACE_ONE"
        delta = min(delta, 0.5)
        names = tuple(datasets)
        try:
            tally = EventTally().added(self._group_records(items, relation))
        except (PrivacyError, ValueError) as error:
            why = f"no sound composition of these names' events is known ({error})"
            return DocumentGroup(names, documents, math.inf, delta, why)
        epsilon = 0.0 if not tally.num_events else math.inf
        for accountant in ("pld", "rdp") if tally.num_events else ():
            try:
                epsilon = tally.summary(accountant, relation).epsilon(delta)
                break
            except (UnsupportedEventError, ValueError):
                continue
        if not math.isfinite(epsilon):
            why = _why_infinite(items, delta, relation)
            return DocumentGroup(names, documents, math.inf, delta, why)
        # A name's own statement holds at its delta cap, below the group's delta: the group
        # never states less than one of its names does.
        stated = [self.spent(s.tenant, s.dataset).epsilon for s in scopes if s.dataset in names]
        stated += [r.budget.epsilon for r in map(filters.get, names) if r is not None]
        epsilon = max([float(epsilon), *stated])
        return DocumentGroup(names, documents, epsilon, float(delta))

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


def _in_relation(epsilon: float, delta: float, source: str, target: str) -> tuple[float, float]:
    """(epsilon, delta) of `source` restated in `target` (group privacy of two for
    add/remove-one to replace-one, Dwork & Roth 2014, Thm 2.2)."""
    if source == target:
        return epsilon, delta
    return 2 * epsilon, min((1 + math.exp(min(epsilon, 700))) * delta, 1.0)


def _leaves(event) -> list:
    """The events a composed event is made of."""
    if isinstance(event, dp_event.ComposedDpEvent):
        return [leaf for e in event.events for leaf in _leaves(e)]
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _leaves(event.event)
    return [event]


def _why_infinite(items: list, delta: float, relation: str) -> str:
    """Why a group's events compose to no finite epsilon at `delta`, in a user's words."""
    names = {"ADD_OR_REMOVE_ONE": [], "REPLACE_ONE": []}
    past = []
    for kind, head, rest in items:
        source = rest[3] if kind == "row" else rest
        name = head if kind == "row" else "a stated (epsilon, delta)"
        if name not in names.setdefault(source, []):
            names[source].append(name)
        if source == relation:
            continue
        for leaf in _leaves(event_from_json(rest[0] if kind == "row" else head)):
            if isinstance(leaf, EpsilonDeltaDpEvent) and name not in past:
                if _in_relation(leaf.epsilon, leaf.delta, source, relation)[1] > delta:
                    past.append(name)
    if past:
        return (
            f"the names mix relations ({', '.join(names['REPLACE_ONE'])} under replace-one, "
            f"{', '.join(names['ADD_OR_REMOVE_ONE'])} under add/remove-one): on replace-one, "
            "an add/remove-one (epsilon, delta) statement doubles its epsilon and multiplies "
            f"its delta by 1 + e^epsilon (group privacy), which is past delta={delta:g}, so no "
            "finite epsilon holds at that delta"
        )
    return f"no accountant composes these events to a finite epsilon at delta={delta:g}"


def _read_keys(conn: Connection) -> list[tuple[str, bytes]]:
    """The ledger's HMAC keys, oldest (the one new digests use) first."""
    rows = conn.execute(
        "SELECT key_id, secret FROM ledger_keys ORDER BY created_at, key_id"
    ).fetchall()
    return [(key_id, bytes.fromhex(secret)) for key_id, secret in rows]


def _ledger_keys(conn: Connection) -> list[tuple[str, bytes]]:
    """`_read_keys`; the first key made if there is none (256 bits from `secrets`)."""
    keys = _read_keys(conn)
    if not keys:
        key_id, secret = secrets.token_hex(8), secrets.token_hex(32)
        conn.execute(
            "INSERT INTO ledger_keys (key_id, secret, created_at) VALUES (?, ?, ?)",
            (key_id, secret, time.time()),
        )
        keys = [(key_id, bytes.fromhex(secret))]
    return keys


def _set_digest(secret: bytes, digests: list[str]) -> str:
    """A keyed id of a whole set of records (which name was bound to which collection)."""
    whole = hmac.new(secret, len(digests).to_bytes(8, "big"), hashlib.sha256)
    for digest in digests:
        whole.update(bytes.fromhex(digest))
    return whole.hexdigest()[:32]


def _sharing(conn: Connection, digests: dict[str, list[str]]) -> list[str]:
    """The names bound to at least one of `digests` (key id -> digests under that key)."""
    found: set[str] = set()
    for key_id, values in digests.items():
        for chunk in _chunks(values):
            marks = ", ".join("?" * len(chunk))
            found.update(
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT dataset FROM document_records WHERE key_id = ? AND "
                    f"digest IN ({marks})",
                    (key_id, *chunk),
                ).fetchall()
            )
    return sorted(found)


def _legacy_sharing(conn: Connection, texts: list[str]) -> list[str]:
    """Names bound before schema 10 (an unkeyed whole-collection digest) to these texts."""
    legacy = conn.execute(
        "SELECT 1 FROM document_sets WHERE fingerprint NOT LIKE ? LIMIT 1", (_KEYED + "%",)
    ).fetchone()
    if legacy is None:
        return []
    rows = conn.execute(
        "SELECT dataset FROM document_sets WHERE fingerprint = ?", (documents_fingerprint(texts),)
    ).fetchall()
    return [r[0] for r in rows]


def _first_bound(conn: Connection) -> dict[str, float]:
    """Each bound name's time of first binding."""
    rows = conn.execute("SELECT dataset, MIN(created_at) FROM document_sets GROUP BY dataset")
    return {r[0]: float(r[1]) for r in rows.fetchall()}


def _linked(conn: Connection, dataset: str) -> set[str]:
    """The names found sharing records with `dataset` at a binding (theirs or its)."""
    links = conn.execute("SELECT other FROM document_links WHERE dataset = ?", (dataset,))
    return {r[0] for r in links.fetchall()}


def _deliberate(conn: Connection, dataset: str) -> set[str]:
    """The names `dataset` was admitted beside deliberately (``--guarantees-add-up``), or
    (ledgers before schema 10) bound to the same whole collection."""
    links = conn.execute(
        "SELECT other FROM document_links WHERE dataset = ? AND deliberate = 1", (dataset,)
    )
    same = conn.execute(
        "SELECT b.dataset FROM document_sets a JOIN document_sets b "
        "ON a.fingerprint = b.fingerprint WHERE a.dataset = ? AND b.dataset <> ? "
        "AND a.fingerprint NOT LIKE ?",
        (dataset, dataset, _KEYED + "%"),
    )
    return {r[0] for r in links.fetchall()} | {r[0] for r in same.fetchall()}


def _is_bound(conn: Connection, dataset: str, set_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM document_sets WHERE dataset = ? AND fingerprint = ?", (dataset, set_id)
    ).fetchone()
    return row is not None


def _bindings_mark(conn: Connection) -> tuple:
    """What changes when any name is bound to a new collection."""
    return tuple(conn.execute("SELECT COUNT(*), MAX(created_at) FROM document_sets").fetchone())


def _legacy_charged(conn: Connection) -> list[str]:
    """Names bound before schema 10 only (an unkeyed whole-collection digest, no records)
    that have charged: their records cannot be compared with a new collection's."""
    rows = conn.execute(
        "SELECT DISTINCT dataset FROM document_sets WHERE fingerprint NOT LIKE ? AND dataset "
        "NOT IN (SELECT dataset FROM document_records)",
        (_KEYED + "%",),
    ).fetchall()
    return [r[0] for r in rows if _has_spent(conn, r[0])]


def undeclared_sharing(store: LedgerStore, conn: Connection, dataset: str) -> list[str]:
    """Names that share records with `dataset`, were not admitted beside it deliberately,
    and have charged: a charge to `dataset` would add up with theirs unannounced (two names
    bound before either charged). Every charge checks it, inside its transaction (its
    dataset's lock); where such names exist it takes the bindings' lock first, so two of
    them never charge at once, each unaware of the other's uncommitted charge."""
    rows = conn.execute(
        "SELECT other FROM document_links WHERE dataset = ? AND deliberate = 0", (dataset,)
    ).fetchall()
    others = [r[0] for r in rows if r[0] != dataset]
    if others:
        store.lock_also(conn, _BIND_LOCK)
    return [other for other in others if _has_spent(conn, other)]


def _has_spent(conn: Connection, dataset: str) -> bool:
    """Whether `dataset` has a charge or per-document filters in the ledger."""
    return any(
        conn.execute(f"SELECT 1 FROM {table} WHERE dataset = ? LIMIT 1", (dataset,)).fetchone()
        for table in ("charges", "document_filters")
    )


_FIELD_ORDER = ("text", "document", "query", "label")


def record_text(record: str | Mapping) -> str:
    """The text a record is bound by: a string itself; a row, its non-empty values
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
    """`ledger.bind_documents` of `records` (texts or rows, `record_text`): what an entry
    point calls before its first charge to `dataset` (see the module docstring)."""
    return ledger.bind_documents(
        dataset, [record_text(r) for r in records], guarantees_add_up=guarantees_add_up
    )

"""Where a privacy ledger lives: SQLite (embedded default) or PostgreSQL (several replicas).

One schema, versioned migrations, and one transaction primitive, `LedgerStore.scope_lock`:
a write transaction in which no other charge to the same dataset can run, whatever the
tenant (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock keyed by the dataset, at
READ COMMITTED on every connection). On PostgreSQL charge ids come from an IDENTITY
sequence drawn under that lock (cache 1), so within a dataset ids grow in commit order,
which the ledger's catch-up (rows with id > the last one folded in) relies on.

Migrations are numbered (`MIGRATIONS`); `schema_version` records the last one applied. A
SQLite file written before versioning is recognised by its columns. Concurrent openers
migrate once. Each migration's statements say in comments what they hold.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_MIGRATION_LOCK = 7_402_114  # PostgreSQL advisory lock id of ledger migrations
_DATASET_LOCK_SEED = 7_402_115  # seed of the hash that keys a dataset's advisory lock


def _migrations(real: str, identity: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """(version, statements) for a dialect's REAL and auto-increment key types."""
    steps: dict[int, tuple[str, ...]] = {}
    steps[1] = (
        "CREATE TABLE IF NOT EXISTS scopes (tenant TEXT NOT NULL, dataset TEXT NOT NULL, "
        f"epsilon_cap {real} NOT NULL, delta_cap {real} NOT NULL, accountant TEXT NOT NULL, "
        f"relation TEXT NOT NULL, created_at {real} NOT NULL, PRIMARY KEY (tenant, dataset))",
        f"CREATE TABLE IF NOT EXISTS charges (id {identity}, tenant TEXT NOT NULL, "
        f"dataset TEXT NOT NULL, stage TEXT NOT NULL, epsilon {real} NOT NULL, "
        f"delta {real} NOT NULL, event TEXT NOT NULL, description TEXT NOT NULL, "
        f"created_at {real} NOT NULL, "
        "FOREIGN KEY (tenant, dataset) REFERENCES scopes (tenant, dataset))",
    )
    # Charges written before this carry no relation: NULL keeps meaning the scope's.
    steps[2] = ("ALTER TABLE charges ADD COLUMN relation TEXT",)
    steps[3] = ("ALTER TABLE charges ADD COLUMN ref TEXT",)
    steps[4] = (
        "CREATE UNIQUE INDEX IF NOT EXISTS charges_ref ON charges (tenant, dataset, ref)"
        " WHERE ref IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS charges_scope ON charges (tenant, dataset, id)",
    )
    steps[5] = (
        # the service's tenants: API keys stored as salted hashes, never plain
        "CREATE TABLE IF NOT EXISTS tenants (name TEXT PRIMARY KEY, key_id TEXT NOT NULL UNIQUE, "
        f"key_salt TEXT NOT NULL, key_hash TEXT NOT NULL, created_at {real} NOT NULL, "
        f"revoked_at {real})",
        # a collection scope composes every charge of its dataset
        "CREATE INDEX IF NOT EXISTS charges_dataset ON charges (dataset, id)",
    )
    steps[6] = (
        # public, newline-separated notes: what the scope's guarantee also rests on (not
        # "description": charges has one, and the ledger joins the two tables)
        "ALTER TABLE scopes ADD COLUMN notes TEXT",
        # the opaque public shape of the one event a repeated release charges (NULL: none)
        "ALTER TABLE scopes ADD COLUMN event_shape TEXT",
    )
    steps[7] = (
        # a collection in individual mode: each document's (epsilon, delta) target, the rho
        # cap it implies, the public per-answer charge and the number of documents
        "CREATE TABLE IF NOT EXISTS document_filters (dataset TEXT PRIMARY KEY, "
        f"epsilon {real} NOT NULL, delta {real} NOT NULL, rho_cap {real} NOT NULL, "
        f"answer_rho {real} NOT NULL, documents INTEGER NOT NULL, created_at {real} NOT NULL)",
        # each charged document's running zCDP loss (documents never charged have no row)
        "CREATE TABLE IF NOT EXISTS document_losses (dataset TEXT NOT NULL, "
        f"doc_id TEXT NOT NULL, rho {real} NOT NULL, charges INTEGER NOT NULL, "
        "PRIMARY KEY (dataset, doc_id))",
    )
    steps[8] = (
        # one row per document per charge: the record the running losses are recomputed from
        "CREATE TABLE IF NOT EXISTS document_charges (dataset TEXT NOT NULL, "
        f"doc_id TEXT NOT NULL, rho {real} NOT NULL, ref TEXT, created_at {real} NOT NULL)",
        "CREATE INDEX IF NOT EXISTS document_charges_doc ON document_charges (dataset, doc_id)",
    )
    steps[9] = (
        # which documents a collection name guards: a digest of its documents (private
        # state, never printed) and their number (`ledger_documents`)
        "CREATE TABLE IF NOT EXISTS document_sets (dataset TEXT NOT NULL, "
        f"fingerprint TEXT NOT NULL, documents INTEGER NOT NULL, created_at {real} NOT NULL, "
        "PRIMARY KEY (dataset, fingerprint))",
        "CREATE INDEX IF NOT EXISTS document_sets_fingerprint ON document_sets (fingerprint)",
    )
    steps[10] = (
        # the ledger's secrets: each record of a collection is kept as a keyed digest
        # (HMAC-SHA-256 under one of these), so only who holds the ledger can test whether
        # a text is in a collection; a copied ledger brings its keys along
        "CREATE TABLE IF NOT EXISTS ledger_keys (key_id TEXT PRIMARY KEY, "
        f"secret TEXT NOT NULL, created_at {real} NOT NULL)",
        # which records each collection name guards (one row per distinct record)
        "CREATE TABLE IF NOT EXISTS document_records (dataset TEXT NOT NULL, "
        "key_id TEXT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY (dataset, key_id, digest))",
        "CREATE INDEX IF NOT EXISTS document_records_digest ON document_records (key_id, digest)",
        # pairs of names found to share at least one record when the later was bound, and
        # whether the pair was admitted deliberately (--guarantees-add-up)
        "CREATE TABLE IF NOT EXISTS document_links (dataset TEXT NOT NULL, "
        f"other TEXT NOT NULL, created_at {real} NOT NULL, "
        "deliberate INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (dataset, other))",
    )
    # which record each document id named when a collection's per-document filters opened
    # (a keyed digest, `DocumentSets.records_under_ids`; NULL: opened before, not pinned)
    steps[11] = ("ALTER TABLE document_filters ADD COLUMN records TEXT",)
    return tuple(steps.items())


# (version, statements) per dialect; append, never edit an applied one.
MIGRATIONS: dict[str, tuple[tuple[int, tuple[str, ...]], ...]] = {
    "sqlite": _migrations("REAL", "INTEGER PRIMARY KEY AUTOINCREMENT"),
    "postgresql": _migrations(
        "DOUBLE PRECISION", "BIGINT GENERATED BY DEFAULT AS IDENTITY (CACHE 1) PRIMARY KEY"
    ),
}
SCHEMA_VERSION = MIGRATIONS["sqlite"][-1][0]


class Connection:
    """A DB-API connection that speaks ``?`` placeholders on both backends."""

    def __init__(self, raw: Any, dialect: str) -> None:
        self.raw, self.dialect = raw, dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self.dialect == "postgresql":
            sql = sql.replace("?", "%s")
        return self.raw.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """`execute` of one statement for each of `rows` (psycopg pipelines them)."""
        if self.dialect == "postgresql":
            with self.raw.cursor() as cursor:
                cursor.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])
            return
        self.raw.executemany(sql, [tuple(r) for r in rows])


def redact_url(url: str) -> str:
    """`url` without its password (what may be logged or stored as the ledger's identity)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def sqlite_path(location: str | Path) -> Path | None:
    """The file of a SQLite ledger location (path or ``sqlite:///path``); None for a server."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        return None
    return Path(text.removeprefix("sqlite:///") if text.startswith("sqlite:") else text)


@contextmanager
def removed_if_refused(location: str | Path) -> Iterator[None]:
    """Runs a block that may create the SQLite ledger at `location`; if the block raises,
    removes what it created (the file, its journal files, the folders made for it).

    A command refused after it opened a new ledger (``retriever tenant add`` with a bad
    cap) must not leave an empty ledger behind. Nothing that existed before the block is
    removed, and server ledgers (PostgreSQL) are left alone.
    """
    path = sqlite_path(location)
    if path is None or path.exists():
        yield
        return
    path = path.expanduser()
    new_folders = []
    folder = path.parent
    while not folder.exists():
        new_folders.append(folder)
        folder = folder.parent
    try:
        yield
    except BaseException:
        for name in (path, *(Path(f"{path}{end}") for end in ("-journal", "-wal", "-shm"))):
            name.unlink(missing_ok=True)
        for made in new_folders:  # innermost first; only if nothing else was put there
            try:
                made.rmdir()
            except OSError:
                break
        raise


def _owner_only(path: Path) -> None:
    """Makes an existing ledger file readable by its owner only (it holds the secret that
    keys the record digests), or warns when this user cannot."""
    import warnings

    mode = path.stat().st_mode
    if not mode & 0o077:
        return
    try:
        os.chmod(path, 0o600)
    except OSError:
        warnings.warn(
            f"the ledger {path} is readable by other users and could not be made private "
            "(chmod 600 it): it holds the secret that keys its record digests",
            stacklevel=3,
        )


class LedgerStore:
    """Connections, transactions and migrations of one ledger database.

    Args:
      location: ``sqlite:///path``, ``postgresql://user@host:port/db`` or a file path.
      timeout: seconds a transaction waits for a lock before failing.
    """

    def __init__(self, location: str | Path, *, timeout: float = 60.0) -> None:
        text = str(location)
        self.timeout = timeout
        self.created = False  # whether this object created the ledger file (SQLite)
        if text.startswith(("postgresql://", "postgres://")):
            self.dialect, self.url, self.path = "postgresql", text, None
            self.identity = redact_url(text)
            self._local = threading.local()
        else:
            path = sqlite_path(text)
            self.dialect, self.path = "sqlite", path
            self.url = f"sqlite:///{path}"
            self.identity = str(path.expanduser().resolve())
            path = path.expanduser()
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:  # a new ledger is the operator's private state: readable by its owner only
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                self.created = True
            except FileExistsError:
                _owner_only(path)
        self._migrate()

    # ---- connections --------------------------------------------------------------------

    @contextmanager
    def _sqlite(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            yield conn
        finally:
            conn.close()

    def _postgres(self) -> Any:
        """This thread's connection (reopened if the server dropped it)."""
        import psycopg  # only PostgreSQL ledgers need it

        conn = getattr(self._local, "conn", None)
        if conn is not None and not (conn.closed or conn.broken):
            try:  # one loopback round trip: a server restart since the last call is survived
                conn.execute("SELECT 1")
                conn.rollback()  # the caller's transaction (and snapshot) starts after this
            except psycopg.OperationalError:
                conn.close()
        if conn is None or conn.closed or conn.broken:
            conn = psycopg.connect(self.url, connect_timeout=int(self.timeout))
            # The scope lock is sound only if every statement after it sees what the previous
            # holder committed: READ COMMITTED, whatever the server's default.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            conn.execute(f"SET lock_timeout = {int(self.timeout * 1000)}")
            conn.commit()
            self._local.conn = conn
        return conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only view of committed data."""
        if self.dialect == "sqlite":
            with self._sqlite() as conn:
                yield Connection(conn, "sqlite")
            return
        conn = self._postgres()
        try:
            yield Connection(conn, "postgresql")
        finally:
            if not (conn.closed or conn.broken):
                conn.rollback()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: committed on exit, rolled back on any exception."""
        if self.dialect == "sqlite":
            with self._sqlite() as conn:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield Connection(conn, "sqlite")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            return
        conn = self._postgres()
        try:
            yield Connection(conn, "postgresql")
        except BaseException:
            if not (conn.closed or conn.broken):
                conn.rollback()
            raise
        conn.commit()

    @contextmanager
    def scope_lock(self, dataset: str, tenant: str | None = None) -> Iterator[Connection]:
        """A write transaction in which no other charge to `dataset` (any tenant) can run.

        SQLite's write lock covers the whole file; PostgreSQL takes an advisory lock keyed
        by a 64-bit hash of the dataset's name (a collision only serialises more), then
        the row lock on (tenant, dataset) that replicas before schema 5 took, so a replica
        not yet upgraded cannot charge that scope concurrently. Stop such replicas before
        opening a collection cap: they do not check it.
        """
        with self.write() as conn:
            self.lock_also(conn, dataset)
            if self.dialect == "postgresql":
                if tenant is not None:  # what replicas before schema 5 lock: they wait
                    conn.execute(
                        "SELECT 1 FROM scopes WHERE tenant = ? AND dataset = ? FOR UPDATE",
                        (tenant, dataset),
                    ).fetchall()
            yield conn

    def lock_also(self, conn: Connection, name: str) -> None:
        """Inside a write transaction: `name`'s lock too, held to its end (SQLite's write
        lock already covers the file). Take locks in one order: datasets' (several: sorted),
        then at most the bindings' (`ledger_documents`)."""
        if self.dialect == "postgresql":
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(?, ?))", (name, _DATASET_LOCK_SEED)
            ).fetchall()

    def close(self) -> None:
        """Closes this thread's PostgreSQL connection (SQLite holds none open)."""
        conn = getattr(getattr(self, "_local", None), "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ---- migrations ---------------------------------------------------------------------

    def _version(self, conn: Connection) -> int:
        if self.dialect == "sqlite":
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if "schema_version" not in tables:
                if "charges" not in tables:
                    return 0
                # A file from before versioning: its columns tell how far it got.
                columns = {row[1] for row in conn.execute("PRAGMA table_info(charges)")}
                return 3 if "ref" in columns else 2 if "relation" in columns else 1
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _migrate(self) -> None:
        with self.write() as conn:
            if self.dialect == "postgresql":
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,)).fetchall()
            version = self._version(conn)
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"ledger schema version {version} is newer than this toolkit's "
                    f"({SCHEMA_VERSION}); upgrade dpsynth"
                )
            if (
                0 < version < 5
                and conn.execute("SELECT 1 FROM scopes WHERE tenant = '*'").fetchone()
            ):
                raise RuntimeError(
                    "this ledger has a tenant named '*', which now names a dataset's collection "
                    "cap over all tenants; rename it with an older dpsynth before upgrading"
                )
            for number, statements in MIGRATIONS[self.dialect]:
                if number > version:
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (number,))

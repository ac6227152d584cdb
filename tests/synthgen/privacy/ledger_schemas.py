"""Ledgers as an older release left them, for the migration tests on SQLite and PostgreSQL."""

from synthgen.privacy.ledger_store import MIGRATIONS

AR = "ADD_OR_REMOVE_ONE"


def write_schema_5_ledger(conn, backend: str) -> None:
    """Writes, on an open connection, the tables of schema 5 and one scope ('*', 'q', cap 5).

    Args:
        conn: a `sqlite3` or `psycopg` connection to an empty database; the caller commits.
        backend: ``"sqlite"`` or ``"postgresql"``, the key of `MIGRATIONS` (and so of the
            parameter style, ``?`` or ``%s``).
    """
    mark = {"sqlite": "?", "postgresql": "%s"}[backend]
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for number, statements in MIGRATIONS[backend][:5]:
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"INSERT INTO schema_version VALUES ({mark})", (number,))
    conn.execute(f"INSERT INTO scopes VALUES ('*', 'q', 5.0, 1e-5, 'pld', {mark}, 0)", (AR,))

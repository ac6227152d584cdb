"""The real-PostgreSQL test fixtures: fresh databases, crash recovery."""

import psycopg
import pytest


def test_fresh_database_per_test(postgres_server, postgres_url):
    with psycopg.connect(postgres_url, connect_timeout=10) as conn:
        name, user = conn.execute("SELECT current_database(), current_user").fetchone()
        assert postgres_url.endswith("/" + name)
        assert name.startswith("t_test_fresh_database_per_test_")
        assert user == "dpsynth"
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        conn.execute("CREATE TABLE t (x int)")  # a fresh database has no such table yet
    assert postgres_server.url.endswith("/postgres")


def test_committed_rows_survive_sigkill(postgres_server, postgres_url):
    with psycopg.connect(postgres_url, connect_timeout=10) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()

    pending = psycopg.connect(postgres_url, connect_timeout=10)
    pending.execute("INSERT INTO t VALUES (2)")  # never committed
    old_pid = postgres_server.postmaster_pid()

    postgres_server.kill()
    assert not postgres_server.is_running()
    with pytest.raises(psycopg.OperationalError):
        pending.execute("COMMIT")
    pending.close()

    postgres_server.start()
    assert postgres_server.postmaster_pid() not in (None, old_pid)
    with psycopg.connect(postgres_url, connect_timeout=10) as conn:
        assert conn.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,)]
    assert "database system was interrupted" in postgres_server.log_tail(50)


def test_stop_and_restart_keep_port_and_data(postgres_server, postgres_url):
    port = postgres_server.port
    with psycopg.connect(postgres_url, connect_timeout=10) as conn:
        conn.execute("CREATE TABLE t AS SELECT 7 AS x")
    postgres_server.restart("fast")
    assert postgres_server.port == port
    with psycopg.connect(postgres_url, connect_timeout=10) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(7,)]

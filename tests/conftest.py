"""Shared test setup: offline datasets, no private data in logs."""

import atexit
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One JAX compilation cache for the session, inherited by the CLI subprocesses the
# integration tests start: a program compiled once (same HLO, same flags) is loaded, not
# recompiled, by later processes and by functions jitted afresh. Set before jax is imported
# (jax reads these variables at import); a fresh, owner-only folder removed at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _JAX_CACHE = tempfile.mkdtemp(prefix="dpsynth-test-jax-cache-")
    atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

# tests/postgres_server.py, importable as a plain module (site-packages may hold
# another `tests` package, e.g. jax-privacy's). Appended, not prepended, so that tests/
# never shadows a real package.
_TESTS_DIR = str(Path(__file__).parent)
if _TESTS_DIR not in sys.path:
    sys.path.append(_TESTS_DIR)
from postgres_server import PostgresServer, find_binaries  # noqa: E402

POSTGRES_MISSING = "PostgreSQL server binaries (Debian package postgresql) not installed"


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the session (``PostgresServer``, started).

    Tests may ``kill()`` / ``stop()`` and ``start()`` it; it keeps its port and data.
    """
    binaries = find_binaries()
    if binaries is None:
        pytest.skip(POSTGRES_MISSING)
    server = PostgresServer(binaries)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def postgres_url(postgres_server, request):
    """URL of a fresh, uniquely named database on the session's server."""
    if not postgres_server.is_running():  # a previous test crashed or stopped it
        postgres_server.start()
    stem = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40]
    return postgres_server.create_database(f"t_{stem}_{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def chromium():
    """Headless Chromium (Debian's `chromium`) driven by playwright; skips with the reason."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("no system Chromium on PATH (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()

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
# XLA's backend optimisations off (`jax_disable_most_optimizations`), inherited by the CLI
# subprocesses: the suite's programs are small and compiled once or twice each, so compile
# time dominates, and unoptimised programs compile in about 0.6x the time (fresh clones of
# 8e30b07 and 049b2aa: ghost clipping 213 s -> 160 s, all tests 45.7 -> 42.5 min of worker
# time). What the tests check (sums, golden logits, charges) holds to their tolerances
# either way; benchmarks and real runs keep the optimisations, and so do the files whose
# time is SmolLM2 running rather than compiling (`OPTIMISED_FILES`).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# And XLA's CPU loop emitters instead of its fusion emitters, likewise inherited: unoptimised
# programs compile in about 0.6x the time with them (tiny T5's gradient: 1.5 s -> 0.9 s;
# fresh clones of 2476e4f and 1b897d2: T5 52 -> 30 s, Llama 28 -> 12 s, ghost clipping
# 168 -> 120 s). `OPTIMISED_FILES` keep the fusion emitters: their time is SmolLM2 running,
# which the loop emitters slow down (the RAG canary audit: 77 -> 115 s when it had them too).
FUSION_EMITTERS = "xla_cpu_use_fusion_emitters"
if FUSION_EMITTERS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{FUSION_EMITTERS}=false".strip()

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


# The longest test files on the CI machine (2 cores; `make test` on a fresh clone of 3d12ebc,
# summed from its slowest tests), longest first. They are scheduled first: with
# `--no-loadscope-reorder` (the Makefile's), pytest-xdist's `--dist loadfile` hands files out
# in collection order, and a long file started last keeps one worker busy while the other
# idles. Unlisted files keep their order, after these.
SLOW_FILES = (
    "tests/integration/test_pipeline.py",
    "tests/integration/test_retriever_cli.py",
    "tests/integration/test_querygen_cli.py",
    "tests/integration/test_quickstart.py",
    "tests/integration/test_audit.py",
    "tests/integration/test_querygen.py",
    "tests/scripts/test_bench_dp_step.py",
    "tests/retriever/rag/test_canary_audit.py",
    "tests/dpsynth/service/test_load.py",
    "tests/dpsynth/service/test_service.py",
    "tests/integration/test_export_cli.py",
    "tests/synthgen/test_ghost_clipping.py",
    "tests/synthgen/test_release_folder.py",
    "tests/synthgen/test_fewshot_utility.py",
    "tests/retriever/test_train.py",
    "tests/integration/test_rag_cli.py",
    "tests/retriever/network/test_engine.py",
    "tests/dpsynth/service/test_individual_service.py",
    "tests/synthgen/models/test_t5.py",
)


# Files that run slower without the optimisations (SmolLM2 trained, decoded or served; two
# runs each way at 59844fc, -n 2: 101 -> 160 s, 62 -> 101 s, 47 -> 74 s). The quick start
# and the main job on a user's pairs, whose SmolLM2 answers two short questions, left this
# list then: with the loop emitters they run faster without (83 -> 61 s, 71 -> 49 s).
OPTIMISED_FILES = (
    "tests/integration/test_audit.py",
    "tests/retriever/rag/test_canary_audit.py",
    "tests/integration/test_service_guide.py",
)


@pytest.fixture(autouse=True, scope="module")
def _xla_optimisations(request):
    """XLA's optimisations and fusion emitters back on for an `OPTIMISED_FILES` module and its
    subprocesses."""
    path = Path(str(request.node.path)).relative_to(request.config.rootpath).as_posix()
    if path not in OPTIMISED_FILES:
        yield
        return
    import jax
    from jax._src import compiler  # the one place that sets every compile's XLA options

    def fusion_emitters_on(*args, env_options_overrides=None, **kwargs):
        # a per-compile option overrides XLA_FLAGS, which the worker's XLA read at start
        overrides = {FUSION_EMITTERS: True, **(env_options_overrides or {})}
        return get_compile_options(*args, env_options_overrides=overrides, **kwargs)

    get_compile_options = compiler.get_compile_options
    jax.devices()  # XLA reads XLA_FLAGS, loop emitters included, before they are stripped below
    before = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0"
    os.environ["XLA_FLAGS"] = flags.replace(f"--{FUSION_EMITTERS}=false", "").strip()
    jax.config.update("jax_disable_most_optimizations", False)
    compiler.get_compile_options = fusion_emitters_on
    try:
        yield
    finally:
        compiler.get_compile_options = get_compile_options
        os.environ["XLA_FLAGS"] = flags
        if before is None:
            os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
        else:
            os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = before
        jax.config.update("jax_disable_most_optimizations", before not in (None, "0"))


def pytest_collection_modifyitems(config, items):
    """Longest files first (`SLOW_FILES`); a stable sort keeps every other order.

    Tests marked `accelerator` skip, with the reason, where JAX runs on the CPU (always in
    `make test`: JAX_PLATFORMS defaults to cpu above; `make test-accelerator` sets it).
    """
    rank = {path: i for i, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if any("accelerator" in item.keywords for item in items):
        import jax

        if jax.default_backend() == "cpu":
            skip = pytest.mark.skip(
                reason="needs a GPU or TPU: JAX runs on the CPU here "
                "(on a device: make test-accelerator, or JAX_PLATFORMS=cuda pytest -m accelerator)"
            )
            for item in items:
                if "accelerator" in item.keywords:
                    item.add_marker(skip)

"""The command lines (`python -m` a module of the three packages) run as a user runs them,
each in a fresh process, without paying for the libraries' imports every time.

`python -m dpsynth.cli.synthgen ...` spends about 4 s of CPU importing jax, flax, datasets and
dp_accounting before the command starts, and the suite runs a few hundred such commands.
`run` forks each one from a server process that imported those libraries once
(multiprocessing's forkserver, preloaded; it never starts an XLA backend). The command then
runs as `python -m` runs it, in a process of its own: it imports the project's modules itself
(an import a command forgot still fails), with its own working folder, `sys.path`,
environment, stdout, stderr and exit status, and it waits for its threads and runs its atexit
handlers before it exits. What differs from a cold start is what the preloaded libraries read
or printed at import: the server starts with this worker's environment at the import of this
module, and a call with another environment (jax's settings, the help texts' default paths),
or that asks for more than captured output, runs in a plain subprocess instead, as does any
other argv. A warning a preloaded library prints at import reaches the server's stderr, not
the command's.
"""

from __future__ import annotations

import atexit
import functools
import json
import locale
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PACKAGES = ("synthgen", "retriever", "dpsynth")
PRELOAD = (  # the third-party libraries the command lines import; a missing one is skipped
    "numpy", "scipy.optimize", "scipy.stats", "pandas", "pyarrow", "datasets",
    "jax", "jax.numpy", "flax.linen", "optax", "chex", "orbax.checkpoint", "tokenizers",
    "dp_accounting", "jax_privacy", "fastapi", "uvicorn", "httpx", "typer", "rich",
)  # fmt: skip
SET_PER_TEST = {"PYTEST_CURRENT_TEST"}  # pytest's, never read by the packages
# Set by jax itself in every process: at its import (TF_CPP_MIN_LOG_LEVEL) and when it starts
# a backend (TPU_SKIP_MDS_QUERY). Absent means these values, in the server as in a fresh run.
JAX_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "1", "TPU_SKIP_MDS_QUERY": "1"}
_context = multiprocessing.get_context("forkserver")
_SERVER_ENV = dict(os.environ)  # this worker's, when a test module imported this one
_lock = threading.Lock()
_started = False


def _start_server() -> None:
    """The forkserver, started once with `_SERVER_ENV` (not a fixture's temporary change)."""
    global _started
    with _lock:
        if _started:
            return
        worker_env = dict(os.environ)
        os.environ.clear()
        os.environ.update(_SERVER_ENV)
        try:
            _context.set_forkserver_preload(list(PRELOAD))
            multiprocessing.forkserver.ensure_running()
            _started = True
        finally:
            os.environ.clear()
            os.environ.update(worker_env)


@functools.cache
def _interpreter_path() -> list[str]:
    """`sys.path` of a fresh interpreter after its first entry (the script's folder)."""
    probe = "import json, sys; print(json.dumps(sys.path[1:]))"
    found = subprocess.run([sys.executable, "-c", probe], env=_SERVER_ENV, cwd="/",
                           capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(found.stdout)


def _forkable(argv: list[str], env: dict[str, str]) -> bool:
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return False
    if not argv[2].startswith(tuple(f"{name}." for name in PACKAGES)):
        return False
    keys = (env.keys() | _SERVER_ENV.keys()) - SET_PER_TEST
    return all(env.get(k, JAX_DEFAULTS.get(k)) == _SERVER_ENV.get(k, JAX_DEFAULTS.get(k))
               for k in keys)  # fmt: skip


def _child(module, args, cwd, env, out, err, python_path):
    for fd, file in ((1, out), (2, err)):
        target = os.open(file, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    code: object = 0
    try:
        xla_bridge = sys.modules.get("jax._src.xla_bridge")
        assert xla_bridge is None or not xla_bridge._backends, "an XLA backend before the fork"
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = [cwd, *python_path]  # what `python -m` puts on it
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:  # the interpreter's own order at exit: the message, threads, atexit, the streams
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code or 0)


def forked(module: str, args: list[str], cwd, env: dict[str, str], timeout=None):
    """`python -m MODULE ARGS` forked from the server: (exit status, stdout, stderr) as bytes."""
    _start_server()
    with tempfile.TemporaryDirectory(prefix="dpsynth-cli-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        out.touch(), err.touch()
        cwd = str(Path(cwd or os.getcwd()).absolute())
        process = _context.Process(
            target=_child,
            args=(module, list(args), cwd, env, str(out), str(err), _interpreter_path()),
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([module, *args], timeout)
        return process.exitcode, out.read_bytes(), err.read_bytes()


def command(cli: str, *args: object, **options) -> subprocess.CompletedProcess:
    """`python -m dpsynth.cli.<cli> ARGS` (`cli`: "synthgen" or "retriever") as a user runs
    it, its output captured as text; `options` (cwd, env, timeout, check) go to `run`."""
    argv = [sys.executable, "-m", f"dpsynth.cli.{cli}", *map(str, args)]
    return run(argv, capture_output=True, text=True, **options)


def decode(output: bytes) -> str:
    """Bytes as `subprocess.run(..., text=True)` gives them: universal newlines."""
    text = output.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def run(argv, *, capture_output, cwd=None, env=None, timeout=None, check=False, text=False,
        **kwargs) -> subprocess.CompletedProcess:  # fmt: skip
    """`subprocess.run(argv, capture_output=True, ...)`, forked from the server where it can be."""
    assert capture_output, "the output is always captured"
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    if kwargs or not _forkable(argv, env):
        return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, check=check, text=text,
                              capture_output=True, **kwargs)  # fmt: skip
    code, stdout, stderr = forked(argv[2], argv[3:], cwd, env, timeout)
    if text:
        stdout, stderr = decode(stdout), decode(stderr)
    result = subprocess.CompletedProcess(argv, code, stdout, stderr)
    if check:
        result.check_returncode()
    return result

"""The command lines (`python -m` a module of the three packages) run as a user runs them,
each in a fresh process, without paying for their imports every time.

`python -m dpsynth.cli.synthgen ...` spends about 4 s of CPU importing jax, flax, datasets and
dp_accounting before the command starts, and the suite runs a few hundred such commands.
`run` forks each one from a server process that imported every module of the three packages
once (multiprocessing's forkserver, preloaded). The command still runs in a process of its
own, with its own working folder, environment, stdout, stderr and exit status, and starts its
own XLA backend after the fork (the server never starts one). What differs from a cold start
is only what was read at import, from the environment the server started with (jax's
settings, the help texts' default paths): a call with another environment, or that asks for
more than captured output, runs in a plain subprocess instead, as does any other argv.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import pkgutil
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

PACKAGES = ("synthgen", "retriever", "dpsynth")
SET_PER_TEST = {"PYTEST_CURRENT_TEST"}  # pytest's, never read by the packages
_SERVER_ENV = dict(os.environ)  # the environment conftest.py set, before any fixture ran
_context = multiprocessing.get_context("forkserver")


def _modules() -> list[str]:
    """Every module of the three packages, and this one (the server's preload)."""
    names = ["cli_process"]
    for name in PACKAGES:
        package = importlib.import_module(name)
        names += [
            m.name
            for m in pkgutil.walk_packages(package.__path__, f"{name}.")
            if not m.name.endswith("__main__")
        ]
    return names


_context.set_forkserver_preload(_modules())


def _forkable(argv: list[str], env: dict[str, str]) -> bool:
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return False
    if not argv[2].startswith(tuple(f"{name}." for name in PACKAGES)):
        return False
    keys = (env.keys() | _SERVER_ENV.keys()) - SET_PER_TEST
    return all(env.get(k) == _SERVER_ENV.get(k) for k in keys)


def _start_server() -> None:
    worker_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(_SERVER_ENV)  # not a fixture's temporary change
    try:
        multiprocessing.forkserver.ensure_running()  # a no-op once it runs
    finally:
        os.environ.clear()
        os.environ.update(worker_env)


def _child(module: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str):
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [module, *args]
    code: object = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code or 0)


def forked(module: str, args: list[str], cwd, env: dict[str, str], timeout=None):
    """`python -m MODULE ARGS` forked from the server: (exit status, stdout, stderr) as bytes."""
    _start_server()
    with tempfile.TemporaryDirectory(prefix="dpsynth-cli-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = _context.Process(
            target=_child, args=(module, args, str(cwd or os.getcwd()), env, str(out), str(err))
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([module, *args], timeout)
        return process.exitcode, out.read_bytes(), err.read_bytes()


def run(argv, *, capture_output, cwd=None, env=None, timeout=None, check=False, text=False,
        **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, capture_output=True, ...)`, forked from the server where it can be."""
    assert capture_output, "the output is always captured"
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    if kwargs or not _forkable(argv, env):
        return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, check=check, text=text,
                              capture_output=True, **kwargs)
    code, stdout, stderr = forked(argv[2], argv[3:], cwd, env, timeout)
    if text:
        stdout, stderr = stdout.decode(), stderr.decode()
    result = subprocess.CompletedProcess(argv, code, stdout, stderr)
    if check:
        result.check_returncode()
    return result

"""A real, throwaway llama.cpp OpenAI-compatible server for tests (no mocks).

``LlamaServer`` runs ``python -m llama_cpp.server`` (the ``server-test`` extra:
``pip install 'llama-cpp-python[server]'``), or llama.cpp's own ``llama-server`` binary
when one is given (``binary=``; not on PyPI: built from llama.cpp's source, found by
`find_llama_server`), on a GGUF file, on a free loopback port chosen at start, with its
log in a fresh temporary folder. It waits until the server
answers ``GET /v1/models`` (bounded), and can be stopped (SIGTERM, then SIGKILL) or
crashed (SIGKILL) to test what a client does when its server dies mid-run.

    server = LlamaServer(gguf_path, n_threads=1)   # raises if llama-cpp-python is missing
    server.start()
    url = server.url                               # http://127.0.0.1:PORT/v1
    server.kill()                                  # crash
    server.cleanup()
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from throwaway_server import ThrowawayServer, ThrowawayServerError, free_port

__all__ = [
    "LlamaServer",
    "LlamaServerError",
    "find_llama_server",
    "free_port",
    "missing_reason",
]

# The modules `python -m llama_cpp.server` imports beyond the base package.
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context")
MISSING = (
    "llama-cpp-python[server] is not installed (the server-test extra: "
    "pip install -e '.[server-test]'; it builds llama.cpp from source, 10-15 min on 2 cores)"
)


class LlamaServerError(ThrowawayServerError):
    """The test server could not be started or stopped."""


def missing_reason() -> str | None:
    """Why the server cannot run here (a skip reason), or None if it can."""
    for name in SERVER_MODULES:
        if importlib.util.find_spec(name) is None:
            return f"{MISSING}: no module {name}"
    return None


def find_llama_server() -> str | None:
    """llama.cpp's ``llama-server``: ``$LLAMA_SERVER`` or on PATH, else None."""
    found = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    return found if found and os.access(found, os.X_OK) else None


class LlamaServer(ThrowawayServer):
    """One llama-cpp-python server process; see the module docstring.

    Args:
      model: path of the GGUF file to serve.
      n_ctx: context length (tokens); clients pass it as ``--server-context``.
      n_threads: CPU threads for generation and for prompt processing.
      timeout: seconds to wait for the server to answer after start, and to exit after stop.
      extra_args: further server options.
      binary: a ``llama-server`` executable to run instead of llama-cpp-python's server.
      parallel: slots of ``llama-server`` (each with ``n_ctx`` tokens); llama-cpp-python's
        server has none (it runs one request at a time), so 1 there.
    """

    error = LlamaServerError

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        n_ctx: int = 2048,
        n_threads: int = 1,
        timeout: float = 120.0,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
        parallel: int = 1,
    ) -> None:
        reason = missing_reason() if binary is None else None
        if reason is not None:
            raise LlamaServerError(reason)
        if binary is None and parallel != 1:
            raise LlamaServerError("llama-cpp-python's server has no parallel slots")
        self.binary, self.parallel = binary, parallel
        self.model = Path(model)
        if not self.model.is_file():
            raise LlamaServerError(f"no GGUF file at {self.model}")
        self.n_ctx, self.n_threads, self.timeout = n_ctx, n_threads, timeout
        self.extra_args = tuple(extra_args)
        self.base_dir: Path | None = None
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (``.../v1``)."""
        return f"http://127.0.0.1:{self.listen_port}/v1"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LlamaServer:
        """Starts the server on a fresh free port and waits until it answers."""
        if self.is_running():
            return self
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="dpsynth-llama-"))
        for _ in range(3):  # a port free when chosen may be taken before the bind
            self.port = free_port()
            self._spawn()
            if self._wait_ready():
                return self
            if "address already in use" not in self.log_tail().lower():
                break
        tail = self.log_tail()
        self.stop()
        raise LlamaServerError(
            f"{self.binary or 'llama_cpp.server'} did not answer on {self.url} within "
            f"{self.timeout:.0f} s\n"
            f"--- server log tail ---\n{tail}"
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `timeout`; no-op if not running."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(self.timeout)
        self._proc = None

    def kill(self) -> None:
        """Simulates a crash: SIGKILL, and wait until the process is gone."""
        if not self.is_running():
            raise LlamaServerError("server is not running")
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait(self.timeout)
        self._proc = None

    def cleanup(self) -> None:
        """Stops the server and deletes its folder."""
        self.stop()
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    # -- internals ----------------------------------------------------------------------

    def _spawn(self) -> None:
        if self.binary is not None:
            cmd = [
                self.binary,
                "-m",
                str(self.model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "-c",
                str(self.n_ctx * self.parallel),
                "-np",
                str(self.parallel),
                "-t",
                str(self.n_threads),
                *self.extra_args,
            ]
        else:
            cmd = self._python_cmd()
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _python_cmd(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.n_threads),
            "--n_threads_batch",
            str(self.n_threads),
            *self.extra_args,
        ]

    def _wait_ready(self) -> bool:
        """Polls ``GET /v1/models`` until it answers 200 (True) or the process exits."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                self._proc = None
                return False
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as response:
                    if response.status == 200 and "data" in json.load(response):
                        return True
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        return False

"""What the throwaway test servers (`postgres_server`, `llama_server`) share: a free loopback
port, the error type, the context manager and the tail of the server's log."""

from __future__ import annotations

import abc
import socket
from pathlib import Path
from typing import Self

__all__ = ["ThrowawayServer", "ThrowawayServerError", "free_port"]


class ThrowawayServerError(RuntimeError):
    """A test server could not be set up, started or stopped."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayServer(abc.ABC):
    """A server process with its files in a temporary folder; `with` starts and cleans it up.

    Subclasses set `error` (their `ThrowawayServerError`), `base_dir` and `port` (None until
    `start`, which returns the server) and implement `cleanup` (stop it and delete its folder).
    """

    error: type[ThrowawayServerError] = ThrowawayServerError
    base_dir: Path | None = None
    port: int | None = None

    @property
    def folder(self) -> Path:
        """The server's temporary folder (its log, and whatever else it writes)."""
        if self.base_dir is None:
            raise self.error("server not started; call start() first")
        return self.base_dir

    @property
    def listen_port(self) -> int:
        """The loopback TCP port the server listens on."""
        if self.port is None:
            raise self.error("server not started; call start() first")
        return self.port

    @property
    def log_file(self) -> Path:
        return self.folder / "server.log"

    @abc.abstractmethod
    def start(self) -> Self:
        """Starts the server on a free loopback port; returns it."""

    @abc.abstractmethod
    def cleanup(self) -> None:
        """Stops the server and deletes its folder."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the server's log, or a note that there is none yet."""
        try:
            text = self.log_file.read_text(errors="replace")
        except (FileNotFoundError, ThrowawayServerError):
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

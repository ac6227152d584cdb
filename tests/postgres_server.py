"""A real, throwaway PostgreSQL server for tests (no mocks).

``PostgresServer`` runs ``initdb`` into a fresh temporary folder, listens on a
free loopback TCP port and a Unix socket in that folder, and is driven with
``pg_ctl``. It can be stopped, crashed (SIGKILL of the postmaster) and started
again on the same data directory and port, so tests can check that committed
data survives a crash. ``fsync`` stays on (the server default).

PostgreSQL refuses to run as root: when the tests run as root, every server
command runs as the ``postgres`` system user (``nobody`` if that is missing)
and the temporary folder is handed to that user.

    server = PostgresServer()      # raises if PostgreSQL is not installed
    server.start()
    url = server.create_database("t1")
    server.kill(); server.start()  # crash and recover
    server.cleanup()
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from throwaway_server import ThrowawayServer, ThrowawayServerError, free_port

__all__ = ["PostgresBinaries", "PostgresServer", "PostgresServerError", "find_binaries"]

DEBIAN_GLOB_ROOT = Path("/usr/lib/postgresql")
DB_USER = "dpsynth"
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresServerError(ThrowawayServerError):
    """The test server could not be set up, started or stopped."""


@dataclass(frozen=True)
class PostgresBinaries:
    initdb: Path
    pg_ctl: Path

    @property
    def bindir(self) -> Path:
        return self.initdb.parent


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.parent.name)) or (0,)


def find_binaries() -> PostgresBinaries | None:
    """``initdb`` and ``pg_ctl`` from one installation, or None if there is none.

    Looks on PATH first (following symlinks to the real folder, so both tools
    come from the same version), then in the newest ``/usr/lib/postgresql/*/bin``.
    """
    candidates: list[Path] = []
    for tool in ("initdb", "pg_ctl"):
        found = shutil.which(tool)
        if found:
            candidates.append(Path(found).resolve().parent)
    candidates += [
        p.parent
        for p in sorted(DEBIAN_GLOB_ROOT.glob("*/bin/initdb"), key=_version_key, reverse=True)
    ]
    for bindir in candidates:
        initdb, pg_ctl = bindir / "initdb", bindir / "pg_ctl"
        if all(os.access(p, os.X_OK) and p.is_file() for p in (initdb, pg_ctl)):
            return PostgresBinaries(initdb=initdb, pg_ctl=pg_ctl)
    return None


class PostgresServer(ThrowawayServer):
    """One PostgreSQL server in a temporary folder; see the module docstring."""

    find_binaries = staticmethod(find_binaries)
    error = PostgresServerError

    def __init__(
        self,
        binaries: PostgresBinaries | None = None,
        *,
        timeout: float = 60.0,
        tmp_parent: str | os.PathLike[str] | None = None,
    ):
        found = binaries or find_binaries()
        if found is None:
            raise PostgresServerError(
                "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under "
                f"{DEBIAN_GLOB_ROOT}/*/bin; install the Debian package postgresql"
            )
        self.binaries = found
        self.timeout = timeout
        self._tmp_parent = tmp_parent
        self.base_dir: Path | None = None
        self.port: int | None = None
        self._fresh = False
        self._run_as = _server_account()

    # -- paths ----------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def socket_dir(self) -> Path:
        return self.folder

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, dbname: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.listen_port}/{dbname}"

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> PostgresServer:
        """Initialise on first call, then start (again) on the same data dir and port."""
        if self.base_dir is None:
            self._init()
        if self.is_running():
            return self
        try:
            self._pg_ctl("start", "-l", str(self.log_file))
        except PostgresServerError:
            # The port was free when chosen but another process may have taken it
            # since. A fresh cluster may move; a restart must keep its port.
            if self._fresh and "already in use" in self.log_tail():
                self.port = free_port()
                self._write_config()
                self._pg_ctl("start", "-l", str(self.log_file))
            else:
                raise
        self._fresh = False
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``); no-op if not running."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown stop mode {mode!r}")
        if self.base_dir is None or not self.is_running():
            return
        self._pg_ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> PostgresServer:
        """Stop (``mode``, or ``"kill"`` for SIGKILL) and start on the same data dir and port."""
        if mode == "kill":
            self.kill()
        else:
            self.stop(mode)
        return self.start()

    def kill(self) -> None:
        """Simulate a crash: SIGKILL the postmaster and every server process it started.

        Waits until they are gone, so that ``start()`` can recover the data dir.
        """
        pid = self.postmaster_pid()
        if pid is None:
            raise PostgresServerError(f"server is not running (no pid in {self._pid_file})")
        children = _children_of(pid)
        for p in [pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + self.timeout
        while any(_alive(p) for p in [pid, *children]):
            if time.monotonic() > deadline:
                raise PostgresServerError(
                    f"server processes {[pid, *children]} still alive {self.timeout:.0f} s "
                    "after SIGKILL"
                )
            time.sleep(0.02)
        if _is_zombie(pid):
            # The orphaned postmaster may stay a zombie for long: PID 1 in some
            # containers does not reap. A new postmaster would take the zombie's
            # pid for a live server and refuse to start, so drop the stale lock
            # files (data dir and socket) as a reboot would.
            self._pid_file.unlink(missing_ok=True)
            (self.socket_dir / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)

    def cleanup(self) -> None:
        """Stop the server (immediately, or SIGKILL if that fails) and delete its folder."""
        if self.base_dir is None:
            return
        try:
            self.stop("immediate")
        except PostgresServerError:
            with contextlib.suppress(PostgresServerError):
                if self.postmaster_pid() is not None:
                    self.kill()
        shutil.rmtree(self.base_dir, ignore_errors=True)
        self.base_dir = None

    # -- queries ----------------------------------------------------------------

    def postmaster_pid(self) -> int | None:
        """The pid recorded in ``postmaster.pid`` if that process is alive."""
        try:
            pid = int(self._pid_file.read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def is_running(self) -> bool:
        return self.postmaster_pid() is not None

    def create_database(self, name: str) -> str:
        """Create database ``name`` (lower-case identifier) and return its URL."""
        import psycopg
        from psycopg import sql

        if not _NAME_RE.match(name):
            raise ValueError(f"database name must match {_NAME_RE.pattern}: {name!r}")
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.database_url(name)

    # -- internals --------------------------------------------------------------

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "postmaster.pid"

    def _init(self) -> None:
        base = Path(tempfile.mkdtemp(prefix="dpsynth-pg-", dir=self._tmp_parent))
        self.base_dir = base
        self._fresh = True
        if self._run_as is not None:
            uid, gid = self._run_as[1:]
            os.chown(base, uid, gid)
            _check_reachable(base, self._run_as[0])
        self._run(
            [
                str(self.binaries.initdb),
                "-D",
                str(self.data_dir),
                "-A",
                "trust",
                "-U",
                DB_USER,
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            what="initdb",
        )
        self.port = free_port()
        with (self.data_dir / "postgresql.conf").open("a") as f:
            f.write("\n# dpsynth tests\ninclude_if_exists = 'dpsynth_test.conf'\n")
        self._write_config()

    def _write_config(self) -> None:
        conf = self.data_dir / "dpsynth_test.conf"
        conf.write_text(
            f"listen_addresses = '127.0.0.1'\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = '{self.socket_dir}'\n"
            "fsync = on\n"
        )
        if self._run_as is not None:
            os.chown(conf, *self._run_as[1:])

    def _pg_ctl(self, action: str, *args: str) -> None:
        cmd = [str(self.binaries.pg_ctl), action, "-D", str(self.data_dir), "-w"]
        cmd += ["-t", str(int(self.timeout)), *args]
        self._run(cmd, what=f"pg_ctl {action}")

    def _run(self, cmd: list[str], *, what: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict = {}
        if self._run_as is not None:
            name, uid, gid = self._run_as
            kwargs = dict(user=uid, group=gid, extra_groups=[])
            env.update(HOME=str(self.folder), USER=name, LOGNAME=name)
        try:
            proc = subprocess.run(
                cmd,
                cwd=self.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout + 30,
                **kwargs,
            )
        except subprocess.TimeoutExpired as e:
            raise PostgresServerError(
                f"{what} timed out after {e.timeout:.0f} s\n--- server log tail ---\n"
                f"{self.log_tail()}"
            ) from e
        if proc.returncode != 0:
            raise PostgresServerError(
                f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                f"{(proc.stdout + proc.stderr).strip()}\n--- server log tail ---\n"
                f"{self.log_tail()}"
            )


def _server_account() -> tuple[str, int, int] | None:
    """(name, uid, gid) to run the server as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return name, pw.pw_uid, pw.pw_gid
    raise PostgresServerError("running as root and neither a 'postgres' nor 'nobody' user exists")


def _check_reachable(path: Path, user: str) -> None:
    """Every parent of ``path`` must be searchable by other users."""
    for parent in path.parents:
        if not parent.stat().st_mode & 0o001:
            raise PostgresServerError(
                f"user {user!r} cannot reach {path}: {parent} is not searchable by others; "
                "point TMPDIR at a folder such as /tmp"
            )


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields after "pid (comm) "


def _is_zombie(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] in ("Z", "X")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _is_zombie(pid)


def _children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    children = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                stat = _proc_stat(int(entry.name))
                if stat is not None and stat[1] == str(pid):
                    children.append(int(entry.name))
    return children

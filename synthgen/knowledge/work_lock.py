"""One release at a time on a private work folder: an exclusive `fcntl.flock` on one file.

A knowledge release keeps what it drew in its private work folder so that a rerun returns the
first draw, never a fresh one (`synthgen.knowledge.facts`).
That only holds if two runs started together on one folder cannot both find it empty and
both draw: each release holds this lock from the moment it reads the folder until what it
drew is written, and a second run waits for it, then reads the first run's draw.

`flock` locks an open file description, so two threads of one process exclude each other as
two processes do. It holds between processes of one machine on a local filesystem; on NFS
without lockd, or on object-store mounts, it may not exclude, and two runs could draw twice.
Run the releases of one work folder on one machine.

Privacy:
  Reads and writes nothing of the records; the log line names the lock file only.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def work_lock(path: str | Path) -> Iterator[None]:
    """Holds an exclusive lock on the file `path` (created if missing) for the block.

    A second holder waits until the first leaves its block, and logs once that it waits.

    Args:
      path: the lock file, inside the private work folder it guards.
    """
    with open(path, "a") as handle:  # closing the file releases the lock, even on an error
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another release that holds %s", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield

"""One release at a time on a private work folder: an exclusive `fcntl.flock` on one file.

A knowledge release keeps what it drew in its private work folder so that a rerun returns
the first draw (`synthgen.knowledge.facts`). Each release holds this lock from reading the
folder until its draw is written, so two runs started together cannot both draw: the
second waits, then reads the first's draw. `flock` excludes threads and processes of one
machine on a local filesystem; on NFS without lockd or object-store mounts it may not, so
run the releases of one work folder on one machine.

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

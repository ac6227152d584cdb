"""One answer at a time per model replica; a bounded queue in front of them.

A request that finds every replica busy waits in the queue; a request that finds the queue
full, or waits longer than the timeout, is refused before it touches the ledger, so a
refusal costs nothing. The answer itself runs in a worker thread (it is JAX/numpy work
that holds no event loop); if the request is cancelled meanwhile, the replica returns to
the pool only when its answer finishes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

Replica = TypeVar("Replica")


class QueueFullError(Exception):
    """Every replica is busy and the queue is full."""


class QueueTimeoutError(Exception):
    """The request waited for a replica longer than the queue timeout."""


class Admission(Generic[Replica]):
    """Runs `fn(replica)` on a free replica, queueing at most `capacity` waiting requests.

    Args:
      replicas: the model replicas; each serves one request at a time.
      capacity: most requests waiting for a replica (0: refuse whenever all are busy).
      timeout: seconds a request may wait for a replica.
    """

    def __init__(self, replicas: list[Replica], *, capacity: int, timeout: float) -> None:
        if not replicas:
            raise ValueError("need at least one replica")
        if capacity < 0 or not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"need capacity >= 0 and timeout > 0, got {capacity=}, {timeout=}")
        self.replicas, self.capacity, self.timeout = list(replicas), capacity, timeout
        self._free: asyncio.Queue | None = None
        self._executor = ThreadPoolExecutor(len(replicas), thread_name_prefix="replica")
        self.waiting = 0
        self.busy = 0

    def _queue(self) -> asyncio.Queue:
        if self._free is None:  # created in the serving loop
            self._free = asyncio.Queue()
            for replica in self.replicas:
                self._free.put_nowait(replica)
        return self._free

    async def run(self, fn: Callable[[Replica], Any]) -> Any:
        """`fn(replica)` in a worker thread once a replica is free.

        Raises:
          QueueFullError: the queue is full (nothing ran).
          QueueTimeoutError: no replica freed up within the timeout (nothing ran).
        """
        free = self._queue()
        if free.empty() and self.waiting >= self.capacity:
            raise QueueFullError(f"all {len(self.replicas)} replicas busy and queue full")
        self.waiting += 1
        try:
            replica = await asyncio.wait_for(free.get(), self.timeout)
        except TimeoutError:
            raise QueueTimeoutError(f"no replica free within {self.timeout:g} s") from None
        finally:
            self.waiting -= 1
        self.busy += 1
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._executor, fn, replica)

        def release(_: Any = None) -> None:
            self.busy -= 1
            free.put_nowait(replica)

        try:
            return await asyncio.shield(job)
        finally:
            if job.done():
                release()
            else:  # cancelled while answering: the replica is free when the answer is
                job.add_done_callback(release)  # runs in the loop

    def retry_after(self) -> int:
        """Seconds a refused client should wait before retrying (at least 1)."""
        return max(1, math.ceil(self.timeout / 4))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

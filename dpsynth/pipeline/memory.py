"""A stage's peak memory, measured without hiding the whole run's peak from outside tools.

The kernel keeps one high-water mark of resident memory per process (``VmHWM``). Resetting
it at each stage (``/proc/self/clear_refs``) gives per-stage figures but makes
``/usr/bin/time -v`` and every other outside tool report only the last stage. Here the mark
is never reset: a stage that sets a new high for the process gets its exact peak (the mark
after it); a stage that stays below an earlier one gets the highest resident size sampled
while it ran (every `interval` seconds, so a spike shorter than that can be missed: the
figure is then a lower bound, flagged ``exact: False``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def high_water_mark_bytes() -> int | None:
    """This process's peak resident memory so far (VmHWM; ru_maxrss where /proc is absent)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024


def resident_bytes() -> int | None:
    """This process's resident memory now (VmRSS), or None where /proc is absent."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


class StagePeak:
    """Context manager measuring the peak resident memory of the block it runs.

    After the block, `bytes` is the peak and `exact` says whether it is the kernel's own
    mark (the block set a new high) or the highest sample (a lower bound).
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.bytes: int | None = None
        self.exact = False
        self._sampled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._sampled = max(self._sampled, resident_bytes() or 0)

    def __enter__(self) -> StagePeak:
        self._before = high_water_mark_bytes()
        self._sampled = resident_bytes() or 0
        if os.path.exists("/proc/self/status"):
            self._thread = threading.Thread(target=self._sample, daemon=True, name="stage-peak")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        after = high_water_mark_bytes()
        self._sampled = max(self._sampled, resident_bytes() or 0)
        if after is not None and (self._before is None or after > self._before):
            self.bytes, self.exact = after, True
        else:
            self.bytes, self.exact = self._sampled or after, False

"""`synthgen.pipeline.memory.StagePeak`: a stage's peak without resetting the process's own
high-water mark (which outside tools such as `/usr/bin/time -v` read)."""

import time
from pathlib import Path

import numpy as np
import pytest

from synthgen.pipeline.memory import StagePeak, high_water_mark_bytes, resident_bytes

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="needs Linux /proc for VmHWM and VmRSS"
)
MIB = 2**20


def _hold(megabytes: int, seconds: float) -> None:
    block = np.ones(megabytes * MIB // 8)  # touched: resident
    time.sleep(seconds)
    del block


def test_a_new_high_is_exact_and_the_process_mark_is_never_lowered():
    before = high_water_mark_bytes()
    with StagePeak() as big:
        _hold((before - resident_bytes()) // MIB + 300, 0.3)  # above every earlier peak
    assert big.exact and big.bytes == high_water_mark_bytes() > before + 250 * MIB
    with StagePeak(interval=0.02) as small:
        _hold(100, 0.5)
    assert not small.exact  # below the earlier high: sampled, a lower bound
    assert resident_bytes() + 80 * MIB < small.bytes + 5 * MIB < big.bytes
    assert high_water_mark_bytes() >= big.bytes  # the run's peak is still visible

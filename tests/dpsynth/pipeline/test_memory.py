"""`dpsynth.pipeline.memory.StagePeak`: a stage's peak without resetting the process's own
high-water mark (which outside tools such as `/usr/bin/time -v` read).

Run in a fresh interpreter: a test worker's own history (earlier tests' peaks) would make
"a new high" depend on test order."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="needs Linux /proc for VmHWM and VmRSS"
)
MIB = 2**20
PROBE = """
import json, time
import numpy as np
from dpsynth.pipeline.memory import StagePeak, high_water_mark_bytes, resident_bytes

def hold(megabytes, seconds):
    block = np.ones(megabytes * 2**20 // 8)  # touched: resident
    time.sleep(seconds)
    del block

before = high_water_mark_bytes()
with StagePeak() as big:
    hold(400, 0.3)
with StagePeak(interval=0.02) as small:
    hold(100, 0.5)
print(json.dumps({
    "before": before, "big": big.bytes, "big_exact": big.exact, "small": small.bytes,
    "small_exact": small.exact, "mark": high_water_mark_bytes(), "resident": resident_bytes(),
}))
"""


def test_a_new_high_is_exact_a_lower_stage_is_sampled_and_the_mark_stays():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    m = json.loads(result.stdout.strip().splitlines()[-1])
    assert m["big_exact"] and m["big"] > m["before"] + 350 * MIB  # the kernel's own mark
    assert not m["small_exact"]  # below the earlier high: the highest sample, a lower bound
    assert m["resident"] + 80 * MIB < m["small"] < m["big"]
    assert m["mark"] >= m["big"]  # the run's peak is still visible to outside tools

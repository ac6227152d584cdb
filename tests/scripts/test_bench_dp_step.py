"""The DP-step benchmark runs end to end (tiny model) and keeps its last-line contract."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_dp_step.py"


def test_bench_last_line_format():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--steps", "1", "--batch", "8",
         "--input-len", "16", "--target-len", "8"],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"dp_vs_nonprivate=([0-9.]+) dp_vs_jax_privacy=([0-9.]+)", last)
    assert match, last
    assert all(float(x) > 0 for x in match.groups())

"""`scripts/payer_precision.py` on a small world: the table, the last line, and a replay
whose exhaustion matches the filters' capacity."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "payer_precision.py"


def test_payer_precision_prints_the_table_and_the_last_line(tmp_path):
    result = subprocess.run(
        [sys.executable, SCRIPT, "--records", "120", "--diseases", "6", "--questions", "30",
         "--dense-taus", "0.5", "--overlap-taus", "0.75", "--out", tmp_path],
        capture_output=True, text=True, env=os.environ | {"HF_DATASETS_OFFLINE": "1"},
        cwd=SCRIPT.parents[1],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    last = dict(kv.split("=") for kv in result.stdout.strip().splitlines()[-1].split())
    assert set(last) == {
        "precision_dense", "precision_overlap", "median_spend_dense", "median_spend_overlap"
    }  # fmt: skip
    assert all(0.0 <= float(v) <= 1.0 for k, v in last.items() if k.startswith("precision"))
    # term overlap at 0.75 needs a word only the asked disease's records hold
    assert float(last["precision_overlap"]) == 1.0
    assert (tmp_path / "results.json").is_file()

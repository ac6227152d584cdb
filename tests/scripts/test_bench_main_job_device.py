"""The device benchmark's smoke run (``--tiny`` on the CPU): every section's figures, the
table last, and the JSON report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_main_job_device.py"


def test_tiny_run_prints_the_table_last_and_writes_the_json(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, SCRIPT, "--tiny", "--out", out],
        capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("device: ")
    header = lines.index("| what | ours | peer | ratio |")
    rows = lines[header + 2 :]
    assert lines[header + 1] == "|---|---|---|---|"
    assert len(rows) == 6 and all(r.startswith("| ") and r.count("|") == 5 for r in rows)
    assert [r.split(":")[0] for r in rows] == ["| gen"] + ["| encoder"] * 3 + ["| decode"] * 2

    report = json.loads(out.read_text())
    assert {"device", "platform", "jax_version", "commit", "peer", "figures"} <= set(report)
    assert report["tiny"] and report["sections"] == ["gen", "encoder", "decode"]
    for figure in report["figures"]:
        assert {"section", "what", "unit", "ours", "compile_s", "peer", "ratio"} <= set(figure)
        assert figure["error"] is None and figure["ours"] > 0
        if figure["peer"] is None:  # torch and transformers are not dpsynth dependencies
            assert figure["ratio"] is None
    assert {f["unit"] for f in report["figures"]} == {"tokens/s", "examples/s", "docs/s"}

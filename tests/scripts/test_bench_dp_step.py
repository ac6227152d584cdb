"""The DP-step benchmark runs end to end (tiny model) and keeps its output contract.

The runs share one JAX persistent compilation cache (a temporary folder) and compile with
LLVM's optimisations off (`--xla_backend_optimization_level=0`): the ahead-of-time run finds
the programs the first run compiled, and the tests stay short on 2 cores. They check the
output, not the compile times or speeds.
"""

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xla_env import with_xla_flags

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_dp_step.py"
TINY = ["--preset", "tiny", "--batch", "4", "--steps", "1", "--input-len", "16",
        "--target-len", "8"]  # fmt: skip
LAST = re.compile(r"dp_vs_nonprivate=(\S+) dp_vs_jax_privacy=(\S+)")
HEADER = "| variant | status | trace s | compile s | s/step | ex/s | vs non-private |"
GHOST = "DP ghost (microbatch 4, auto) [default]"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jax-cache")


def _run(args: list[str], cache: Path) -> list[str]:
    env = {
        **with_xla_flags("--xla_backend_optimization_level=0"),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()


def _rows_running(marker: Path) -> list[Path]:
    """Row processes (`--result-file` in their arguments) of the run whose arguments hold
    `marker`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # the process ended meanwhile
            continue
        if str(marker).encode() in cmdline and b"--result-file" in cmdline:
            found.append(proc)
    return found


def _state(proc: Path) -> str:
    """A /proc entry's state letter and parent pid (`/proc/PID/stat`), or why not."""
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError as error:
        return f"gone ({error.strerror})"
    return f"state {fields[0]}, parent {fields[1]}"


def _row(lines: list[str], label: str) -> list[str]:
    rows = [ln for ln in lines if ln.startswith(f"| {label}")]
    assert len(rows) == 1, lines
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_run_prints_the_table_and_the_last_line(cache, tmp_path):
    out = tmp_path / "bench.json"
    variants = "nonprivate,dp-ghost,matmul-bf16"
    lines = _run([*TINY, "--variants", variants, "--matmul-size", "256", "--json", str(out)], cache)
    assert any(ln.startswith(HEADER) for ln in lines), lines
    nonprivate, ghost = _row(lines, "non-private (batched grad)"), _row(lines, GHOST)
    for row in (nonprivate, ghost):
        status, compile_s, step_s, rate = row[1], row[3], row[4], row[5]
        assert status == "ok"
        assert float(compile_s) >= 0 and float(step_s) > 0 and float(rate) > 0
    assert "TFLOP/s" in _row(lines, "bf16 matmul (peak for MFU)")[5]
    assert ghost[6] != "–" and ghost[12].endswith("%")  # ratio and MFU
    match = LAST.fullmatch(lines[-1])
    assert match, lines[-1]
    assert float(match[1]) > 0 and math.isnan(float(match[2]))  # jax_privacy not asked for

    record = json.loads(out.read_text())
    rows = {r["variant"]: r for r in record["rows"]}
    # The ghost norms ask for exact-input products; the non-private step has none.
    assert rows["dp-ghost"]["census"]["dot_exact"] > 0
    assert rows["nonprivate"]["census"]["dot_exact"] == 0
    # The analytic model FLOPs and XLA's count of the non-private step agree in magnitude
    # (XLA adds the softmax, norms and Adafactor, relatively large at tiny sizes).
    per_example = rows["nonprivate"]["xla_flops"] / 4
    assert 0.7 < per_example / record["model_flops_per_example"] < 2.0


def test_aot_only_in_subprocesses_writes_the_analyses(cache, tmp_path):
    out = tmp_path / "bench.json"
    args = [*TINY, "--variants", "dp-ghost,matmul-bf16", "--aot-only"]
    lines = _run([*args, "--timeout-per-variant", "300", "--json", str(out)], cache)
    assert any(ln.startswith(HEADER) for ln in lines), lines
    assert _row(lines, GHOST)[1] == "compiled (aot-only)"
    assert LAST.fullmatch(lines[-1]) and lines[-1].count("nan") == 2, lines[-1]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["matmul-bf16"]["status"] == "skipped (aot-only)"
    ghost = rows["dp-ghost"]
    assert "step_s" not in ghost and ghost["compile_s"] >= 0
    assert ghost["hlo_chars"] > 0 and ghost["xla_flops"] > 0 and ghost["temp_bytes"] is not None
    assert ghost["census"]["dot"] > 0 and ghost["census"]["dot_exact"] > 0


def test_a_variant_past_its_timeout_is_reported_and_the_run_goes_on(cache):
    lines = _run([*TINY, "--variants", "dp-ghost", "--timeout-per-variant", "0.5"], cache)
    assert _row(lines, GHOST)[1].startswith("timeout (0.5 s)")
    assert LAST.fullmatch(lines[-1]) and lines[-1].count("nan") == 2, lines[-1]


def test_hlo_census_counts_ops_precision_and_sizes(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_dp_step", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    hlo = """
  %a = f32[16,128,512]{2,1,0} parameter(0)
  %b = f32[16,128,512]{2,1,0} parameter(1)
  %i = s32[2048,1]{1,0} parameter(2)
  %dot.1 = f32[16,128,128]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, operand_precision={highest,highest}
  %dot.2 = bf16[8,8]{1,0} dot(bf16[8,8]{1,0} %c, bf16[8,8]{1,0} %d), lhs_contracting_dims={1}
  %dot.4 = f32[8,8]{1,0} dot(%c, %d), lhs_contracting_dims={1}, algorithm=dot_f32_f32_f32
  ROOT %scatter.3 = f32[32128,512]{1,0} scatter(%e, %i, %u), update_window_dims={1}
  %w = (s32[], f32[2]{0}) while(%t), condition=%c, body=%b, backend_config={"known_trip_count":{"n":"4"}}
"""  # noqa: E501
    census = bench.hlo_census(hlo)
    ops = ("dot", "dot_exact", "dot_highest", "dot_f32_f32_f32", "scatter", "while")
    assert [census[op] for op in ops] == [3, 2, 1, 1, 1, 1]
    assert census["while_trips"] == {"4": 1}
    assert census["scatters"] == ["f32[32128,512] <- (?, s32[2048,1], ?)"]
    assert census["largest"][0] == "scatter f32[32128,512] 63 MiB"


def test_a_stopped_run_prints_what_it_has_and_leaves_no_row_running(cache, tmp_path):
    out = tmp_path / "stopped.json"
    args = [*TINY, "--variants", "dp-ghost", "--timeout-per-variant", "300", "--json", str(out)]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().startswith("T5 tiny")
    deadline = time.monotonic() + 60
    while not _rows_running(out) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll until the row's process has started
    assert _rows_running(out)
    proc.send_signal(signal.SIGTERM)
    lines = proc.stdout.read().strip().splitlines()
    assert proc.wait(timeout=60) == 0
    assert _row(lines, GHOST)[1] == "stopped (signal)"
    assert LAST.fullmatch(lines[-1]), lines[-1]
    assert json.loads(out.read_text())["rows"][0]["status"] == "stopped (signal)"
    # the row's group was sent SIGKILL: a process of it may still be exiting a moment (seen
    # once on a loaded 2-core machine), never for long
    deadline = time.monotonic() + 10
    while _rows_running(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {str(p): _state(p) for p in _rows_running(out)}
    assert not left, left  # the state and parent of each, for the next reader

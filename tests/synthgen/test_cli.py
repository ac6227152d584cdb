"""CLI contract: one-line errors, exit codes, JSON output."""

import json
import subprocess
import sys


def _synthgen(*args):
    return subprocess.run(
        [sys.executable, "-m", "synthgen.cli", *args], capture_output=True, text=True
    )


def test_help():
    result = _synthgen("--help")
    assert result.returncode == 0
    for word in ("assets", "privacy", "ledger"):
        assert word in result.stdout


def test_usage_error_is_one_line_exit_2():
    result = _synthgen(
        "privacy",
        "dpsgd",
        "--num-examples",
        "100",
        "--batch-size",
        "10",
        "--epochs",
        "1",
        "--delta",
        "1e-5",
        "--noise-multiplier",
        "1",
        "--target-epsilon",
        "1",
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "exactly one" in result.stderr


def test_value_error_is_one_line_without_traceback():
    result = _synthgen(
        "privacy",
        "dpsgd",
        "--num-examples",
        "10",
        "--batch-size",
        "100",
        "--epochs",
        "1",
        "--delta",
        "1e-5",
        "--noise-multiplier",
        "1",
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: batch_size")


def test_debug_shows_traceback():
    result = _synthgen(
        "privacy",
        "dpsgd",
        "--num-examples",
        "10",
        "--batch-size",
        "100",
        "--epochs",
        "1",
        "--delta",
        "1e-5",
        "--noise-multiplier",
        "1",
        "--debug",
    )
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_json_keys():
    result = _synthgen(
        "privacy",
        "dpsgd",
        "--num-examples",
        "1000",
        "--batch-size",
        "10",
        "--epochs",
        "1",
        "--delta",
        "1e-5",
        "--noise-multiplier",
        "1",
        "--accountant",
        "rdp",
        "--json",
    )
    out = json.loads(result.stdout)
    assert {"epsilon", "delta", "noise_multiplier", "steps", "sampling_rate", "accountant"} <= set(
        out
    )
    assert out["steps"] == 100


def test_ledger_show(tmp_path):
    from synthgen.privacy import PrivacyLedger, Scope, pure_epsilon_event

    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "d", 1.0, 1e-6))
    ledger.charge("t", "d", stage="s", event=pure_epsilon_event(0.25), relation="ADD_OR_REMOVE_ONE")
    result = _synthgen("ledger", "show", "--db", str(tmp_path / "l.sqlite"), "--json")
    [row] = json.loads(result.stdout)
    assert row["charges"] == 1 and abs(row["epsilon_spent"] - 0.25) < 1e-3
    assert row["relation"] == "ADD_OR_REMOVE_ONE"

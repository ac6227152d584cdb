"""The README's two commands: `make demo` installs only what the demo needs."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_demo_installs_no_test_or_docs_extra():
    plan = subprocess.run(
        ["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("[" not in line for line in installs), installs
    assert "pipeline --config demo" in plan
    test_plan = subprocess.run(
        ["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "'.[test,docs]'" in test_plan

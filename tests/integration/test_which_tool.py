"""The "which tool for which data" guide's commands, run as a newcomer copies them (like the
quick start's: from an empty folder, in page order, with the installed console scripts)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "which_tool.md"


def _quickstart():
    path = Path(__file__).with_name("test_quickstart.py")
    spec = importlib.util.spec_from_file_location("quickstart_commands_source", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guide_names_a_command_per_kind_of_data():
    commands = _quickstart().quickstart_commands(GUIDE.read_text())
    assert any(c.startswith("synthgen pipeline init --pairs") for c in commands), commands
    assert any(c.startswith("retriever knowledge release") for c in commands), commands
    assert any(c.startswith("synthgen generate-docs") for c in commands), commands


def test_the_guide_runs_from_an_empty_folder(tmp_path):
    work = tmp_path / "newcomer"
    _quickstart().run_from_an_empty_folder(GUIDE, work, timeout=1200)
    assert (work / "runs" / "my_log" / "report" / "report.html").is_file()
    data = json.loads((work / "runs" / "my_log" / "stages" / "data.json").read_text())
    assert data["summary"]["train_pairs"] > 0 and data["summary"]["test_queries"] > 0
    assert (work / "tickets" / "release").is_dir()
    assert any((work / "fewshot_docs").iterdir())

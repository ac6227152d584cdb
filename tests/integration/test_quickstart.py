"""The quick-start guide's commands, run as a newcomer copies them: from an empty folder that
is not the checkout, in the order the page gives them, with the installed console scripts.

The guide (docs/quickstart.md) marks each block to run with a `% test: run` comment line (a
MyST comment: it does not render) right before the fence. Every line of those blocks runs
here verbatim; a changed command, option or config name fails this test.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
MARK = "% test: run"


def quickstart_commands(text: str) -> list[str]:
    """The command lines of the blocks marked `% test: run`, in page order.

    Raises:
      ValueError: a mark is not followed by a bash fence, or a marked block is unclosed.
    """
    lines = text.splitlines()
    commands: list[str] = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```bash":
            raise ValueError(f"line {i + 1}: {MARK!r} must be followed by a ```bash fence")
        for j in range(i + 2, len(lines)):
            if lines[j].strip() == "```":
                break
            if lines[j].strip() and not lines[j].lstrip().startswith("#"):
                commands.append(lines[j].strip())
        else:
            raise ValueError(f"line {i + 2}: the marked block is not closed")
    return commands


def test_quickstart_commands_are_found():
    """The extraction itself: marks, fences, comments, order (so the run test cannot pass on
    an empty list)."""
    page = "\n".join(
        ["text", MARK, "```bash", "a --x", "# a comment", "", "b", "```", "```bash", "not run"]
        + ["```", MARK, "```bash", "c", "```"]
    )
    assert quickstart_commands(page) == ["a --x", "b", "c"]
    with pytest.raises(ValueError, match="must be followed"):
        quickstart_commands(f"{MARK}\ntext")
    with pytest.raises(ValueError, match="not closed"):
        quickstart_commands(f"{MARK}\n```bash\na")
    commands = quickstart_commands(GUIDE.read_text())
    assert any(c.startswith("synthgen pipeline --config tiny") for c in commands), commands
    assert any(c.startswith("retriever index query") for c in commands), commands


def test_the_fetch_step_names_every_asset_the_tiny_run_needs():
    """After the quick start's `synthgen assets fetch` line, the tiny run is offline."""
    from dpsynth.configs import tiny
    from dpsynth.pipeline.config import config_assets

    fetch = [c for c in quickstart_commands(GUIDE.read_text()) if "assets fetch" in c]
    assert fetch, "the quick start fetches nothing"
    fetched = {w for c in fetch for w in c.split()[3:] if not w.startswith("-")}
    assert set(config_assets(tiny.get_config())) <= fetched


def run_from_an_empty_folder(guide: Path, work: Path, timeout: float) -> list[tuple[str, str]]:
    """Runs the marked commands of `guide` in page order from the new folder `work`, with the
    console scripts of the environment running the tests first on PATH (skips where they are
    not installed); asserts each exits 0. Returns (command, stdout) pairs."""
    scripts = Path(sys.executable).parent
    if shutil.which("synthgen", path=str(scripts)) is None:
        pytest.skip(f"console scripts not installed beside {sys.executable} (pip install -e .)")
    work.mkdir()
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("DPSYNTH_LEDGER", None)
    outputs = []
    for command in quickstart_commands(guide.read_text()):
        done = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        outputs.append((command, done.stdout))
    return outputs


def test_quickstart_runs_from_an_empty_folder(tmp_path):
    """Each command exits 0 from a folder outside the checkout, with the console scripts of
    the environment running the tests first on PATH; the run it makes is a complete one."""
    work = tmp_path / "newcomer"
    by_command = dict(run_from_an_empty_folder(GUIDE, work, timeout=900))
    report = work / "runs" / "tiny" / "report" / "report.html"
    assert report.is_file()
    ledger = next(out for c, out in by_command.items() if c.startswith("synthgen ledger show"))
    assert re.search(r"train-pairs: epsilon \d", ledger), ledger
    query = next(out for c, out in by_command.items() if c.startswith("retriever index query"))
    assert re.search(r"^\s+1\. \S+\s+-?\d", query, re.MULTILINE), query
    assert (work / "my_config.py").is_file()

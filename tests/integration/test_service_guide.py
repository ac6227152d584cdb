"""The service guide's "Start here" blocks, run as a newcomer copies them: one bash session
from an empty folder outside the checkout, with the installed console scripts, the only change
being the guide's port 8000 replaced by a free one (a test may not assume a port is free).

The blocks are those marked `% test: run` in docs/guides/service.md (as in the quick start):
a changed command, option or question there fails this test.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from throwaway_server import free_port

pytestmark = pytest.mark.slow
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "service.md"
MARK = "% test: run"


def marked_blocks(text: str) -> list[str]:
    """The bodies of the ```bash blocks right after a `% test: run` line, verbatim."""
    blocks = re.findall(rf"^{re.escape(MARK)}\n```bash\n(.*?)^```$", text, re.M | re.S)
    if text.count(MARK) != len(blocks):
        raise ValueError(f"a {MARK!r} line is not followed by a closed ```bash block")
    return blocks


def test_the_marked_blocks_are_found():
    blocks = marked_blocks(GUIDE.read_text())
    script = "".join(blocks)
    for command in ("retriever data medical", "retriever index build", "retriever tenant add"):
        assert command in script
    assert "retriever serve" in script and "/answer" in script
    with pytest.raises(ValueError, match="not followed"):
        marked_blocks(f"{MARK}\ntext\n")


def _json_objects(text: str) -> list[dict]:
    """Every JSON object in `text`, in order (curl -s ends its reply without a newline)."""
    decoder, objects, i = json.JSONDecoder(), [], text.find("{")
    while i != -1:
        obj, end = decoder.raw_decode(text, i)
        objects.append(obj)
        i = text.find("{", end)
    return objects


def test_the_sample_collection_serves_a_dp_answer(tmp_path):
    scripts = Path(sys.executable).parent
    if shutil.which("retriever", path=str(scripts)) is None:
        pytest.skip(f"console scripts not installed beside {sys.executable} (pip install -e .)")
    port = free_port()
    body = "".join(marked_blocks(GUIDE.read_text())).replace(":8000", f":{port}")
    body = body.replace("--port 8000", f"--port {port}")
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + body
    env = os.environ | {"PATH": f"{scripts}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    budget, answered = _json_objects(result.stdout)[-2:]  # the two curl replies
    assert budget["tenant"] == "alice" and budget["spent_epsilon"] == 0.0
    answer = answered["answer"]
    # auto is facts; the guide's medical question is read by no kind rule, so keywords'
    # release answers it inside the facts answer
    assert answer["mechanism"] == "facts"
    assert answer["epsilon"] == pytest.approx(5.0, abs=1e-3)
    assert answer["remaining_epsilon"] < budget["remaining_epsilon"]
    assert answer["text"].strip()
    assert (tmp_path / "sample" / "index").is_dir() and (tmp_path / "ledger.sqlite").is_file()

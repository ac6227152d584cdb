"""The suite's command-line runner gives what `subprocess.run` gives, in a process of its own."""

import json
import os
import subprocess
import sys

import cli_process
import pytest

PROBE = """\
import atexit, json, os, sys, threading, time
print(json.dumps({"cwd": os.getcwd(), "path0": sys.path[0], "probe": os.environ.get("PROBE"),
                  "argv": sys.argv[1:], "main": __name__,
                  "path": sys.path}))
sys.stdout.flush()
print("bar 1\\rbar 2\\r\\nline", file=sys.stderr)
atexit.register(lambda: print("atexit ran", file=sys.stderr))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined"))).start()
if sys.argv[1] == "raise":
    raise ValueError("boom")
sys.exit({"none": None, "three": 3, "message": "a message"}[sys.argv[1]])
"""


@pytest.mark.parametrize("ending", ["none", "three", "message", "raise"])
def test_a_forked_module_sees_and_gives_what_python_dash_m_does(tmp_path, ending):
    (tmp_path / "cli_probe.py").write_text(PROBE)
    env = {**os.environ, "PROBE": "seen"}
    fresh = subprocess.run([sys.executable, "-m", "cli_probe", ending], cwd=tmp_path, env=env,
                           capture_output=True, text=True)  # fmt: skip
    code, out, err = cli_process.forked("cli_probe", [ending], tmp_path, env, timeout=60)
    assert code == fresh.returncode == {"none": 0, "three": 3, "message": 1, "raise": 1}[ending]
    assert cli_process.decode(out) == fresh.stdout  # the folder, path, environment, threads
    seen = json.loads(fresh.stdout.splitlines()[0])
    assert seen == {"cwd": str(tmp_path), "path0": str(tmp_path), "probe": "seen",
                    "argv": [ending], "main": "__main__", "path": seen["path"]}  # fmt: skip
    assert not [p for p in seen["path"] if p.rstrip("/").endswith("/tests")]
    assert fresh.stdout.endswith("thread joined\n")
    if ending == "raise":  # the traceback's frames differ: runpy's own, or the runner's
        assert cli_process.decode(err).splitlines()[-2:] == fresh.stderr.splitlines()[-2:]
        assert fresh.stderr.endswith("ValueError: boom\natexit ran\n")
    else:
        assert cli_process.decode(err) == fresh.stderr  # newlines as text=True gives them
        assert fresh.stderr.startswith("bar 1\nbar 2\nline\n")
    assert "PROBE" not in os.environ


def test_the_command_lines_are_forked_and_give_what_a_fresh_interpreter_gives(
    tmp_path, monkeypatch
):
    commands = (  # a refusal, an accountant's figures, a help text
        ("dpsynth.cli.synthgen", "generate-docs", "--private", "missing.jsonl"),
        ("dpsynth.cli.retriever", "privacy", "rag", "--tokens", "32", "--delta", "1e-6",
         "--target-epsilon", "5", "--json"),
        ("dpsynth.cli.synthgen", "privacy", "dpsgd", "--help"),
    )  # fmt: skip
    argvs = [[sys.executable, "-m", *command] for command in commands]
    fresh = [subprocess.run(a, capture_output=True, text=True, cwd=tmp_path) for a in argvs]
    monkeypatch.setattr(cli_process.subprocess, "run", None)  # no fallback from here
    for argv, want in zip(argvs, fresh):
        got = cli_process.run(argv, capture_output=True, text=True, cwd=tmp_path)
        assert (got.returncode, got.stdout, got.stderr) == (
            want.returncode, want.stdout, want.stderr)  # fmt: skip
    assert [r.returncode for r in fresh] == [2, 0, 0]
    assert json.loads(fresh[1].stdout)["epsilon"] <= 5


def test_another_environment_or_argv_runs_in_a_plain_subprocess(tmp_path, monkeypatch):
    argv = [sys.executable, "-m", "dpsynth.cli.retriever", "--help"]
    assert cli_process._forkable(argv, {**os.environ, "PYTEST_CURRENT_TEST": "another"})
    assert not cli_process._forkable(argv, {**os.environ, "DPSYNTH_LEDGER": str(tmp_path)})
    assert cli_process._forkable(argv, {**os.environ, **cli_process.JAX_DEFAULTS})  # jax's own
    assert not cli_process._forkable(argv, {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert not cli_process._forkable([sys.executable, "-c", "pass"], dict(os.environ))
    assert not cli_process._forkable([sys.executable, "-m", "pytest"], dict(os.environ))
    monkeypatch.setattr(cli_process, "forked", None)  # no fork from here
    result = cli_process.run(argv, capture_output=True, env={**os.environ, "COLUMNS": "40"})
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0 and lines[1].strip() == "[OPTIONS] COMMAND [ARGS]..."  # 40 wide

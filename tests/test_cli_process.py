"""The suite's command-line runner gives what `subprocess.run` gives, in a process of its own."""

import json
import os
import subprocess
import sys

import cli_process


def test_a_forked_command_gives_what_a_fresh_interpreter_gives(tmp_path):
    # a refusal (stderr, exit status 2), a help text (stdout) and a working folder of its own
    for args in (("generate-docs", "--private", "missing.jsonl"), ("privacy", "dpsgd", "--help")):
        argv = [sys.executable, "-m", "dpsynth.cli.synthgen", *args]
        assert cli_process._forkable(argv, dict(os.environ))
        forked = cli_process.run(argv, capture_output=True, text=True, cwd=tmp_path)
        fresh = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            fresh.returncode, fresh.stdout, fresh.stderr)  # fmt: skip
    assert forked.returncode == 0 and "Usage:" in forked.stdout


def test_the_child_is_a_process_of_its_own_with_the_callers_folder_and_environment(tmp_path):
    env = {**os.environ, "PROBE": "seen"}
    code, out, err = cli_process.forked("cli_process_probe", ["a", "b"], tmp_path, env, timeout=60)
    seen = json.loads(out)
    assert code == 3 and err == b"to stderr\n"
    assert seen == {"cwd": str(tmp_path), "pid": seen["pid"], "probe": "seen",
                    "argv": ["a", "b"], "main": "__main__"}  # fmt: skip
    assert seen["pid"] != os.getpid()
    assert "PROBE" not in os.environ


def test_another_environment_or_argv_runs_in_a_plain_subprocess(tmp_path):
    argv = [sys.executable, "-m", "dpsynth.cli.retriever", "--help"]
    assert cli_process._forkable(argv, {**os.environ, "PYTEST_CURRENT_TEST": "another"})
    assert not cli_process._forkable(argv, {**os.environ, "DPSYNTH_LEDGER": str(tmp_path)})
    assert not cli_process._forkable([sys.executable, "-c", "pass"], dict(os.environ))
    assert not cli_process._forkable([sys.executable, "-m", "pytest"], dict(os.environ))
    result = cli_process.run(argv, capture_output=True, env={**os.environ, "COLUMNS": "40"})
    assert result.returncode == 0 and isinstance(result.stdout, bytes)

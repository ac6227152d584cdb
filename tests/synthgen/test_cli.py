"""CLI contract: one-line errors, exit codes, JSON output."""

import json
import subprocess
import sys

import cli_process


def _synthgen(*args):
    return cli_process.command("synthgen", *args)


def _dpsgd(num_examples, batch_size, *extra, before=()):
    """`synthgen privacy dpsgd` over one epoch at delta 1e-5 and noise multiplier 1."""
    return _synthgen(
        *before, "privacy", "dpsgd", "--num-examples", num_examples, "--batch-size", batch_size,
        "--epochs", "1", "--delta", "1e-5", "--noise-multiplier", "1", *extra,
    )  # fmt: skip


def test_help():
    result = _synthgen("--help")
    assert result.returncode == 0
    for word in ("assets", "privacy", "ledger"):
        assert word in result.stdout


def test_the_command_lines_start_without_the_numeric_libraries():
    """Both CLIs build their command tree without jax, numpy, dp_accounting or datasets
    (each command imports what it runs), and `synthgen.privacy` loads a name's module on
    first use only: a fast `--help`, and no second of dp_accounting for `index query`."""
    heavy = ("jax", "numpy", "dp_accounting", "datasets", "scipy", "flax")
    probe = (
        "import sys, dpsynth.cli.synthgen, dpsynth.cli.retriever, synthgen.privacy.errors; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
    import synthgen.privacy as privacy

    assert all(getattr(privacy, name) is not None for name in privacy.__all__)
    assert "gaussian_event" in dir(privacy)


def test_the_main_jobs_configs_and_status_load_without_jax_or_datasets():
    """Every packaged config is built, and the status functions imported, as `synthgen
    pipeline status` does, with the settings modules alone: no jax, flax or datasets."""
    heavy = ("jax", "flax", "datasets")
    probe = (
        "import sys; from dpsynth.pipeline import load_pipeline_config, stage_status; "
        "[load_pipeline_config(n) for n in ('demo', 'gpu', 'tiny')]; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_a_bare_command_prints_its_help_without_an_error():
    for args in ((), ("ledger",)):
        result = _synthgen(*args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage:") and "error" not in result.stderr


def test_pipeline_init_without_a_name_lists_the_names():
    result = _synthgen("pipeline", "init")
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in ("demo", "gpu", "tiny"))


def test_usage_error_is_one_line_exit_2():
    result = _dpsgd("100", "10", "--target-epsilon", "1")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "exactly one" in result.stderr


def test_value_error_is_one_line_without_traceback():
    result = _dpsgd("10", "100")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: batch_size")


def test_debug_shows_traceback():
    result = _dpsgd("10", "100", "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_json_keys():
    result = _dpsgd("1000", "10", "--accountant", "rdp", "--json")
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


# ---- issue 34: --version, --debug in --help, option names at 80 columns, caps, --ledger ----


def _commands(group, path=()):
    """(command path, click command) of every command of a click group, depth first."""
    import click

    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def assert_every_option_shown_in_full(app):
    """`--help` of every command at COLUMNS=80 names every option of it uncut."""
    import typer
    from typer.testing import CliRunner

    runner, root = CliRunner(), typer.main.get_command(app)
    commands = list(_commands(root))
    assert len(commands) >= 5
    for path, command in commands:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, (path, result.output)
        assert "…" not in result.output, path
        words = set(result.output.replace(",", " ").replace("/", " ").split())
        for param in command.params:
            for name in (*param.opts, *param.secondary_opts):
                if name.startswith("-"):
                    assert name in words, f"{' '.join(path)} --help cuts {name}"


def test_version():
    from importlib.metadata import version

    result = _synthgen("--version")
    assert result.returncode == 0
    assert result.stdout == f"dpsynth {version('dpsynth')}\n"


def test_debug_is_a_documented_global_option():
    result = _synthgen("--help")
    assert result.returncode == 0
    assert "--debug" in result.stdout and "--version" in result.stdout
    # before the subcommand too (as --help now suggests), not only after it
    before = _dpsgd("10", "100", before=("--debug",))
    assert before.returncode != 0 and "Traceback" in before.stderr


def test_help_shows_every_option_name_in_full_at_80_columns():
    from dpsynth.cli.synthgen import app

    assert_every_option_shown_in_full(app)


def test_a_bad_cap_names_the_option_and_exits_2(tmp_path):
    # parsed first, before the command checks anything else or opens the ledger
    ledger = str(tmp_path / "l.sqlite")
    result = _synthgen("generate-docs", "--budget", "-1", "--ledger", ledger, "--epsilon", "1")
    assert result.returncode == 2
    assert result.stderr == "error: --budget must be positive, got -1.0\n"
    assert not (tmp_path / "l.sqlite").exists()


def test_ledger_help_names_the_default_path(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "DPSYNTH_LEDGER"}
    env.update(XDG_DATA_HOME=str(tmp_path / "data"))
    want = str(tmp_path / "data" / "dpsynth" / "ledger.sqlite")
    for command in (("ledger", "show"), ("generate-docs",), ("train-generator",)):
        result = cli_process.run(
            [sys.executable, "-m", "dpsynth.cli.synthgen", *command, "--help"],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        text = "".join(result.stdout.split())  # help wraps (and may cut a long path)
        assert f"<datafolder>/dpsynth/ledger.sqlite;here{want}" in text, command


def test_ledger_show_writes_the_spend_rounded_up(tmp_path):
    from synthgen.privacy import PrivacyLedger, Scope, pure_epsilon_event

    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "d", 1.0, 1e-6, "basic"))
    event = pure_epsilon_event(0.12341)
    ledger.charge("t", "d", stage="s", event=event, relation="ADD_OR_REMOVE_ONE")
    text = _synthgen("ledger", "show", "--db", str(tmp_path / "l.sqlite")).stdout
    assert text.startswith("t/d: epsilon 0.1235 of 1 spent")  # up, never below
    [row] = json.loads(
        _synthgen("ledger", "show", "--db", str(tmp_path / "l.sqlite"), "--json").stdout
    )
    assert (row["epsilon_spent_text"], row["epsilon_remaining_text"]) == ("0.1235", "0.8765")


def test_ledger_documents_and_show_state_the_per_document_summary(tmp_path):
    # issue 35: an individual-mode collection's aggregates, never a document's figure
    from synthgen.privacy import PrivacyLedger
    from synthgen.privacy.document_filters import SUMMARY_KEYS, DocumentFilter, DocumentFilters
    from synthgen.privacy.individual import DocumentBudget

    db = str(tmp_path / "l.sqlite")
    filters = DocumentFilters(PrivacyLedger(db).store)
    budget = DocumentBudget(epsilon=10.0, delta=1e-6)
    filters.open(DocumentFilter("records", budget, budget.rho_cap / 3.5, 10))
    for _ in range(3):
        filters.charge("records", ["secret-id-1", "secret-id-2"], budget.rho_cap / 3.5)
    result = _synthgen("ledger", "documents", "--db", db, "--dataset", "records", "--json")
    summary = json.loads(result.stdout)
    assert tuple(summary) == SUMMARY_KEYS
    assert (summary["documents"], summary["active"], summary["exhausted"]) == (10, 8, 2)
    assert summary["max_epsilon"] <= 10.0 and summary["median_epsilon"] == 0.0
    shown = _synthgen("ledger", "show", "--db", db)
    assert "records (individual accounting" in shown.stdout and "2 exhausted" in shown.stdout
    assert "secret-id" not in shown.stdout + result.stdout
    missing = _synthgen("ledger", "documents", "--db", db, "--dataset", "other")
    assert missing.returncode == 2 and "not in individual accounting" in missing.stderr


def test_no_progress_silences_the_datasets_bars_too():
    import datasets
    from typer.testing import CliRunner

    from dpsynth.cli.synthgen import app
    from dpsynth.cli.synthgen.pipeline import _bars

    assert "progress bars on stderr" in CliRunner().invoke(app, ["pipeline", "--help"]).output
    try:
        _bars(False)
        assert not datasets.is_progress_bar_enabled()
    finally:
        datasets.enable_progress_bars()


def test_the_main_job_is_listed_first_with_every_summary_whole_at_80_columns():
    """Issue 51: `pipeline` first; no command summary cut with "..."; choices as values."""
    from typer.testing import CliRunner

    from dpsynth.cli.synthgen import app

    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}).output
    commands = out.split("Commands:")[1].split()
    assert commands[0] == "pipeline"
    assert "..." not in out.split("Commands:")[1]
    out = CliRunner().invoke(app, ["privacy", "--help"], env={"COLUMNS": "80"}).output
    assert "(Tang et al. 2024)" in " ".join(out.split())  # "et al." does not end it
    out = CliRunner().invoke(app, ["privacy", "dpsgd", "--help"], env={"COLUMNS": "80"}).output
    assert "--sampling poisson|shuffle" in out and "<str>" not in out

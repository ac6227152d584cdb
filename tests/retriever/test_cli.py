"""`retriever` command-line contract (issue 34): --version, --debug in --help, option names
uncut at 80 columns, caps refused by the option's name before any ledger is created."""

import os
import re
from importlib.metadata import version

import cli_process
import pytest
from typer.testing import CliRunner

from dpsynth.cli.retriever import app
from tests.synthgen.test_cli import assert_every_option_shown_in_full


def _retriever(*args, env=None):
    return cli_process.command("retriever", *args, env=env)


def test_version_and_debug_in_help():
    result = _retriever("--version")
    assert (result.returncode, result.stdout) == (0, f"dpsynth {version('dpsynth')}\n")
    result = _retriever("--help")
    assert result.returncode == 0 and "--debug" in result.stdout and "--version" in result.stdout


def test_help_shows_every_option_name_in_full_at_80_columns():
    assert_every_option_shown_in_full(app)
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"})
    assert "--encoder-independent-of-collection" in result.output  # cut before issue 34


def test_a_port_out_of_range_is_a_one_line_usage_error():
    for port in ("-5", "70000"):
        result = CliRunner().invoke(app, ["serve", "--port", port])
        assert result.exit_code == 2 and "--port" in result.output
        assert "Traceback" not in result.output and "OverflowError" not in result.output


def _tenant_add(ledger, *caps):
    return _retriever("tenant", "add", "alice", "--ledger", str(ledger), "--dataset", "d", *caps)


def test_a_bad_cap_names_the_option_exits_2_and_creates_no_ledger(tmp_path):
    ledger = tmp_path / "new" / "ledger.sqlite"
    for caps, message in [
        (("--epsilon", "-1", "--delta", "1e-6"), "--epsilon must be positive, got -1.0"),
        (("--epsilon", "1", "--delta", "1.5"), "--delta must be in (0, 1), got 1.5"),
        (
            ("--epsilon", "1", "--delta", "1e-6", "--collection-epsilon", "0"),
            "--collection-epsilon must be positive, got 0.0",
        ),
    ]:
        result = _tenant_add(ledger, *caps)
        assert (result.returncode, result.stderr) == (2, f"error: {message}\n")
    assert not (tmp_path / "new").exists()


def test_a_refused_tenant_add_removes_the_ledger_it_created_only(tmp_path):
    ledger = tmp_path / "new" / "ledger.sqlite"
    result = _tenant_add(ledger, "--epsilon", "1", "--delta", "1e-6")  # no collection cap
    assert result.returncode == 1 and "no collection cap" in result.stderr
    assert not ledger.exists() and not (tmp_path / "new").exists()
    caps = ("--epsilon", "1", "--delta", "1e-6", "--collection-epsilon", "2")
    assert _tenant_add(ledger, *caps, "--collection-delta", "1e-6").returncode == 0
    again = _tenant_add(ledger, *caps, "--collection-delta", "1e-6")  # the name exists
    assert again.returncode == 1 and "exists" in again.stderr
    assert ledger.exists()  # not created by the refused command: kept, tenant and all
    assert "alice" in _retriever("tenant", "list", "--ledger", str(ledger)).stdout


def test_ledger_help_names_the_default_path(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DPSYNTH_LEDGER"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    want = str(tmp_path / "data" / "dpsynth" / "ledger.sqlite")
    for command in (("answer",), ("train-dp",)):
        result = _retriever(*command, "--help", env=env)
        assert f"<datafolder>/dpsynth/ledger.sqlite;here{want}" in "".join(result.stdout.split())


def test_cli_modules_import_no_other_command_lines_helpers():
    """House style: shared helpers live in the library (synthgen.command_line,
    dpsynth.cli.retriever.options), never in the other tool's cli package."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pairs = (("retriever", "dpsynth.cli.synthgen"), ("synthgen", "dpsynth.cli.retriever"))
    for package, other in pairs:
        paths = sorted((root / "dpsynth" / "cli" / package).glob("*.py"))
        assert len(paths) > 5, package
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                bad = [n for n in names if n == other or n.startswith(other + ".")]
                assert not bad, f"{path.relative_to(root)} imports {bad}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("collection", "icl", 2.0, None), "go with --accounting individual"),
        (("individual", "facts", 2.0, 1e-6), "icl only, got --mechanism facts"),
        (("individual", "icl", None, 1e-6), "needs --document-epsilon and --document-delta"),
        (("individual", "icl", 2.0, 1e-6, 10.0, 1e-5), "takes no collection cap"),
        (("both", "icl", None, None), "must be one of collection, individual"),
    ],
)
def test_check_accounting_refuses_options_that_do_not_go_with_the_mode(args, message):
    """serve, answer and tenant add share one check (dpsynth.cli.retriever.options)."""
    import click

    from dpsynth.cli.retriever.options import check_accounting

    with pytest.raises(click.UsageError, match=message):
        check_accounting(*args)


def test_check_accounting_returns_the_per_document_target():
    from dpsynth.cli.retriever.options import check_accounting

    assert check_accounting("collection", "keywords", None, None, 10.0, 1e-5) is None
    assert check_accounting("individual", "icl", 2.0, 1e-6) == (2.0, 1e-6)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--reuse-answers", "shared"), "shared needs --accounting individual"),
        (("--reuse-answers", "everyone"), "must be one of off, tenant, shared"),
        (("--document-cache",), "the tiny test LM has no keys to cache"),
    ],
)
def test_serve_refuses_reuse_and_cache_options_that_cannot_work(tmp_path, capsys, extra, message):
    """Refused from public options (exit 2, the console script's handling), before any
    file is read or any ledger is created."""
    from synthgen.command_line import run

    ledger = tmp_path / "ledger.sqlite"
    code = run(
        app,
        ["serve", "--index", str(tmp_path / "index"), "--private-corpus",
         str(tmp_path / "c.jsonl"), "--ledger", str(ledger), "--lm", "tiny",
         "--mechanism", "icl", *extra],
    )  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert message in err
    assert not ledger.exists()


def test_serve_names_a_missing_index_corpus_or_ledger_and_creates_nothing(tmp_path, capsys):
    """Each missing input is named (exit 2) before a ledger is opened: a mistyped --ledger
    path is refused, not started as an empty ledger (issue 51)."""
    import numpy as np

    from retriever.index import ExactSearcher
    from retriever.index_folder import save_index_folder
    from synthgen.command_line import run

    index, corpus = tmp_path / "index", tmp_path / "c.jsonl"
    save_index_folder(
        index,
        ExactSearcher(np.eye(2, 4, dtype=np.float32)),
        encoder="all-minilm-l6-v2",
        doc_ids=["a", "b"],
    )
    corpus.write_text('{"doc_id": "a", "text": "x"}\n{"doc_id": "b", "text": "y"}\n')
    ledger = tmp_path / "ledger.sqlite"

    def serve(index=index, corpus=corpus, ledger=ledger):
        argv = ["serve", "--index", index, "--private-corpus", corpus, "--ledger", ledger]
        code = run(app, [*map(str, argv), "--lm", "tiny", "--mechanism", "icl"])
        return code, " ".join(capsys.readouterr().err.split())

    code, err = serve(index=tmp_path / "nope")
    assert code == 2 and "--index" in err and f"no index at {tmp_path / 'nope'}" in err
    code, err = serve(corpus=tmp_path / "nope.jsonl")
    assert code == 2 and "--private-corpus" in err and "no corpus file" in err
    assert "collection cap" not in err
    code, err = serve(ledger=tmp_path / "typo.sqlite")
    assert code == 2 and "--ledger" in err and "no ledger at" in err
    assert not (tmp_path / "typo.sqlite").exists()
    for command in (["tenant", "list"], ["tenant", "revoke", "alice"]):
        assert run(app, [*command, "--ledger", str(tmp_path / "typo.sqlite")]) == 2
    assert not (tmp_path / "typo.sqlite").exists()


def test_choices_print_their_values_and_a_wrong_one_is_a_usage_error():
    """Issue 51: `--mechanism auto|icl|...`, not `<str>`; a value outside is exit 2 naming
    the option; the CLI's list of mechanisms is the library's."""
    from dpsynth.cli.retriever.options import MECHANISMS
    from retriever.rag.plan import MECHANISMS as LIBRARY

    assert MECHANISMS == LIBRARY
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"})
    assert "--mechanism auto|icl|keywords|facts" in result.output
    assert "--accounting collection|individual" in result.output
    result = _retriever("serve", "--mechanism", "magic")
    assert result.returncode == 2
    assert "--mechanism must be one of auto, icl" in result.stderr and "'magic'" in result.stderr
    # a retired mechanism says so, and what to use instead (one line, exit 2)
    result = _retriever("serve", "--mechanism", "vote")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the vote mechanism was retired" in result.stderr and "use facts" in result.stderr


def test_data_facts_writes_a_sample_collection_and_refuses_an_unknown_domain(tmp_path):
    import json

    runner = CliRunner()
    result = runner.invoke(
        app, ["data", "facts", "--out", str(tmp_path), "--domain", "people", "--facts-per-level",
              "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["facts"] == 6
    assert (tmp_path / "corpus.jsonl").is_file() and (tmp_path / "questions.jsonl").is_file()
    bad = runner.invoke(app, ["data", "facts", "--out", str(tmp_path), "--domain", "planets"])
    assert bad.exit_code != 0 and "--domain" in bad.output


def test_every_command_that_binds_documents_accepts_what_its_refusal_suggests():
    """A new name over charged records is refused with `--dataset OLD` or
    `--guarantees-add-up` (`SharedDocumentsError`): every command that binds accepts both."""
    import typer.main

    from dpsynth.cli.retriever import app as retriever_app
    from dpsynth.cli.synthgen import app as synthgen_app
    from synthgen.privacy.ledger_documents import SharedDocumentsError

    message = str(SharedDocumentsError("new", ["old"]))
    suggested = set(re.findall(r"--[a-z][a-z-]+", message))
    assert suggested == {"--dataset", "--guarantees-add-up"}
    retriever_cmd = typer.main.get_command(retriever_app)
    synthgen_cmd = typer.main.get_command(synthgen_app)
    binding = [
        retriever_cmd.commands["answer"],
        retriever_cmd.commands["serve"],
        retriever_cmd.commands["train-dp"],
        retriever_cmd.commands["knowledge"].commands["release"],
        retriever_cmd.commands["contributor"].commands["build"],
        *(synthgen_cmd.commands[name] for name in (
            "train-generator", "generate-docs", "generate-queries-fewshot", "generate-docs-pe"
        )),
    ]  # fmt: skip
    for command in binding:
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert suggested <= options, (command.name, suggested - options)


def test_an_audit_verdict_shouts_its_keyword_only():
    from dpsynth.cli.retriever.knowledge import _shout_verdict

    assert _shout_verdict("no leak found (by the f-DP bound alone)") == (
        "NO LEAK FOUND (by the f-DP bound alone)"
    )
    assert _shout_verdict("leak") == "LEAK" and _shout_verdict("inconclusive") == "INCONCLUSIVE"

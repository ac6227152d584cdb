"""What every command line of the project shares: the error wrapper, the global options
and common option types.

`run` turns the errors a user can fix into one line on stderr and a non-zero exit code;
`--debug` shows the traceback instead. `global_options` is both tools' top-level callback:
it documents `--debug` and answers `--version`. `retriever.cli` uses both.
"""

from __future__ import annotations

import importlib.metadata
import math
import sys
from typing import Annotated

import click
import typer

from synthgen.assets import AssetError
from synthgen.paths import default_ledger_help
from synthgen.privacy.errors import PrivacyError

USER_ERRORS = (AssetError, PrivacyError, ValueError, KeyError, FileNotFoundError)


def _option_name(param: click.Parameter) -> str:
    return max(param.opts, key=len) if param.opts else str(param.name)


def positive(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Option callback: a positive, finite epsilon (an epsilon cap or a release's epsilon).

    Refused at parsing, before the command opens anything, naming the option the user typed
    (``--epsilon must be positive, got -1.0``, a usage error: exit 2) rather than the
    library field it feeds.
    """
    if value is not None and not 0 < value < math.inf:
        raise click.UsageError(f"{_option_name(param)} must be positive, got {value!r}", ctx)
    return value


def probability(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Option callback: a delta in (0, 1), refused as `positive` refuses an epsilon."""
    if value is not None and not 0 < value < 1:
        raise click.UsageError(f"{_option_name(param)} must be in (0, 1), got {value!r}", ctx)
    return value


SplitOption = Annotated[
    str, typer.Option(help="wiki corpus only: all | train | test (split by document)")
]
PresetOption = Annotated[
    str,
    typer.Option(
        help="query-generator preset: a name in synthgen/configs/querygen.py (shipped with the "
        "package), or path/to/file.py:NAME (an entry of that file's PRESETS dict)"
    ),
]

SeedOption = Annotated[
    int | None,
    typer.Option(help="tests only: a fixed seed makes the release reproducible (warned)"),
]
LedgerOption = Annotated[
    str | None,
    typer.Option(help=f"ledger: file, sqlite:///... or postgresql://... ({default_ledger_help()})"),
]
TenantOption = Annotated[str, typer.Option(help="ledger tenant")]
DatasetOption = Annotated[str | None, typer.Option(help="ledger dataset (default: file name)")]
BudgetOption = Annotated[
    float | None, typer.Option(help="epsilon cap of a new ledger scope", callback=positive)
]
SEED_WARNING = (
    "warning: --seed fixes the mechanism's randomness: anyone who knows it can replay the "
    "noise; for tests only, not for publication (recorded in metadata.json)"
)
ModelOption = Annotated[
    str,
    typer.Option(help="asset name, .gguf file or HF Llama folder; 'tiny' = the test LM"),
]
ServerOption = Annotated[
    str | None,
    typer.Option(
        help="OpenAI-compatible base URL (e.g. http://localhost:8000/v1) of a server you run "
        "yourself: it sees the private prompts; --model then only names the tokenizer, and "
        "--server-model the served model"
    ),
]
ServerContextOption = Annotated[
    int | None,
    typer.Option(
        help="context length (tokens) the server was started with; required with --server"
    ),
]
ServerPromptOption = Annotated[
    str,
    typer.Option(
        help="auto | tokens | text: how prompts reach --server; auto probes it once with a "
        "public prompt and sends token ids where accepted, text otherwise"
    ),
]
TopLogprobsOption = Annotated[
    int, typer.Option(help="log-probs per --server reply (servers cap it, often at 20)")
]
ServerConcurrencyOption = Annotated[
    int, typer.Option(help="--server requests in flight at once (the M prompts of a token)")
]


def _print_version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("dpsynth")
        except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
            version = "unknown (not installed)"
        print(f"dpsynth {version}")
        raise typer.Exit(0)


def global_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="print dpsynth's version and exit",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="on an error, show the traceback instead of one line (may stand anywhere on "
            "the command line)",
        ),
    ] = False,
) -> None:
    """The top-level options of `synthgen` and `retriever` (`app.callback()`).

    `--debug` is read by `run` from the whole command line before parsing, so it also works
    after a subcommand; it is declared here so that the top-level ``--help`` lists it.
    """


def run(application: typer.Typer, argv: list[str] | None = None) -> int:
    """Runs a Typer app, turning known errors into one line and exit code 1 (2 for usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    try:
        result = application(args=argv, standalone_mode=False)
        return result if isinstance(result, int) else 0
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - one line for users, traceback with --debug
        if debug:
            raise
        format_message = getattr(exc, "format_message", None)
        if callable(format_message) and hasattr(exc, "exit_code"):  # click/typer usage errors
            print(f"error: {format_message()}", file=sys.stderr)
            return exc.exit_code
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = "" if isinstance(exc, USER_ERRORS) else f"{type(exc).__name__}: "
        print(f"error: {kind}{message} (rerun with --debug for a traceback)", file=sys.stderr)
        return 1

"""What every command line of the project shares: the error wrapper and common option types.

`run` turns the errors a user can fix into one line on stderr and a non-zero exit code;
`--debug` shows the traceback instead. `retriever.cli` runs its app through it too.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from synthgen.assets import AssetError
from synthgen.privacy.errors import PrivacyError

USER_ERRORS = (AssetError, PrivacyError, ValueError, KeyError, FileNotFoundError)

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
    str | None, typer.Option(help="ledger: file, sqlite:///... or postgresql://...")
]
TenantOption = Annotated[str, typer.Option(help="ledger tenant")]
DatasetOption = Annotated[str | None, typer.Option(help="ledger dataset (default: file name)")]
BudgetOption = Annotated[float | None, typer.Option(help="epsilon cap of a new ledger scope")]
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

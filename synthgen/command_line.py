"""Shared pieces of the two command lines: the one-line error wrapper, option validators and
types.

`dpsynth.cli.synthgen` and `dpsynth.cli.retriever` are entry points that never import each
other's helpers: what both use lives here, in the library (the error wrapper `run`, the
top-level `global_options`, the validators, and the ``...Option`` types both tools declare
alike, such as `LedgerOption`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from synthgen.assets import AssetError
from synthgen.paths import default_ledger_help
from synthgen.privacy.errors import PrivacyError

__all__ = [
    "USER_ERRORS",
    "LedgerOption",
    "global_options",
    "positive",
    "probability",
    "run",
]

USER_ERRORS = (AssetError, PrivacyError, ValueError, KeyError, FileNotFoundError)
"""Errors a user can fix: `run` prints their message alone, without the exception's type."""


def _option_name(param: click.Parameter) -> str:
    return max(param.opts, key=len) if param.opts else str(param.name)


def _checked(ctx: click.Context, param: click.Parameter, value, valid: bool, wanted: str):
    """`value`, or a usage error (exit 2) naming the option the user typed: ``--epsilon
    must be positive, got -1.0`` rather than the library field it feeds."""
    if value is not None and not valid:
        raise click.UsageError(f"{_option_name(param)} must be {wanted}, got {value!r}", ctx)
    return value


def positive(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Option callback: a positive, finite epsilon (an epsilon cap or a release's epsilon),
    refused at parsing, before the command opens anything (`_checked`)."""
    return _checked(ctx, param, value, value is not None and 0 < value < math.inf, "positive")


def probability(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Option callback: a delta in (0, 1), refused as `positive` refuses an epsilon."""
    return _checked(ctx, param, value, value is not None and 0 < value < 1, "in (0, 1)")


LedgerOption = Annotated[
    str | None,
    typer.Option(help=f"ledger: file, sqlite:///... or postgresql://... ({default_ledger_help()})"),
]


GuaranteesAddUpOption = Annotated[
    bool,
    typer.Option(
        "--guarantees-add-up",
        help="charge these records under this name although other names of the ledger "
        "have charged the same records: the guarantees add up (`synthgen ledger show` "
        "prints the names together with their composed total)",
    ),
]

# options that commands of both tools declare alike
JsonOption = Annotated[bool, typer.Option("--json", help="one JSON object")]
JsonFlagOption = Annotated[bool, typer.Option("--json")]
OutFolderOption = Annotated[Path, typer.Option(help="output folder")]
DocumentsLimitOption = Annotated[int | None, typer.Option(help="first N documents only")]

# DP-SGD training (`synthgen train-generator`, `retriever train-dp`, the canary audit's runs)
SecretWorkDirOption = Annotated[
    Path | None,
    typer.Option(
        help="SECRET work folder: resume state incl. the noise key and sampler state; "
        "never ship it (default: <ledger folder>/work/<out name>-<hash>)"
    ),
]
KeepSecretWorkOption = Annotated[
    bool, typer.Option(help="keep the secret work folder after a finished run")
]
TargetEpsilonOption = Annotated[float | None, typer.Option(help="target epsilon")]
DpSgdDeltaOption = Annotated[float | None, typer.Option(help="default 1/(2n)")]
PairsLimitOption = Annotated[int | None, typer.Option(help="first N pairs only")]
TestSeedOption = Annotated[int | None, typer.Option(help="tests only; default OS entropy")]


@contextlib.contextmanager
def usage_errors(*errors: type[Exception], option: str | None = None) -> Iterator[None]:
    """Turns `errors` raised in the block into a usage error (exit 2) with their message,
    naming `option` where given."""
    try:
        yield
    except errors as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


@contextlib.contextmanager
def refusals(*errors: type[Exception]) -> Iterator[None]:
    """Turns `errors` raised in the block into a refusal: ``error: MESSAGE`` on stderr and
    exit code 2 (where a command keeps exit code 1 for a finding)."""
    try:
        yield
    except errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None


def parse_shard(text: str | None):
    """`--shard I/N` as a `synthgen.shards.Shard` (None when not given); a malformed one is a
    usage error naming the option."""
    from synthgen.shards import Shard

    if text is None:
        return None
    with usage_errors(ValueError, option="--shard"):
        return Shard.parse(text)


def _print_version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("dpsynth")
        except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
            version = "unknown (not installed)"
        print(f"dpsynth {version}")
        raise typer.Exit(0)


def one_of(*values: str):
    """Option callback: the value is one of `values`, or a usage error naming the option
    (exit 2). Declared with ``metavar="a|b"`` so that help prints the values, not <str>."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        return _checked(ctx, param, value, value in values, f"one of {', '.join(values)}")

    return check


def choice(*values: str, help: str) -> Any:  # noqa: A002 - typer's own name
    """A `typer.Option` whose value is one of `values`: help prints them (``a|b``, not
    <str>) and any other value is a usage error naming the option (`one_of`)."""
    return typer.Option(help=help, metavar="|".join(values), callback=one_of(*values))


class HelpGroup(TyperGroup):
    """A command list readable at 80 columns: the main job (``pipeline``) first, and each
    summary whole, wrapped rather than cut with "..." (click's default)."""

    first = ("pipeline",)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(super().list_commands(ctx), key=lambda name: name not in self.first)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command_summary(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


_ABBREVIATIONS = ("al.", "e.g.", "i.e.", "etc.", "vs.", "cf.")


def command_summary(command: click.Command) -> str:
    """A command's one-line summary: its ``short_help``, or its help's first sentence whole
    (an abbreviation such as "et al." does not end it)."""
    if command.short_help:
        return command.short_help
    words = " ".join((command.help or "").split("\n\n")[0].split()).split(" ")
    for i, word in enumerate(words):
        if word.endswith(".") and not word.endswith(_ABBREVIATIONS):
            return " ".join(words[: i + 1])
    return " ".join(words)


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
    """Runs a Typer app, turning known errors into one line and exit code 1 (2 for usage).

    Args:
      application: the Typer app (`dpsynth.cli.synthgen.app` or `dpsynth.cli.retriever.app`).
      argv: the arguments after the program name (default: ``sys.argv[1:]``); ``--debug``
        anywhere among them re-raises errors with their traceback.

    Returns:
      The exit code: 0, the command's own code, 1 for an error, 2 for a usage error, 130
      when aborted.
    """
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
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare command: its help, no error
            print(format_message())
            return 0
        if callable(format_message) and hasattr(exc, "exit_code"):  # click/typer usage errors
            print(f"error: {format_message()}", file=sys.stderr)
            return exc.exit_code
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = "" if isinstance(exc, USER_ERRORS) else f"{type(exc).__name__}: "
        print(f"error: {kind}{message} (rerun with --debug for a traceback)", file=sys.stderr)
        return 1

"""What both command lines build alike: the apps of the tools, their command groups and console
scripts, a run's admission to the ledger and a DP training run's summary.

`dpsynth.cli.synthgen` and `dpsynth.cli.retriever` never import each other; the option types,
validators and error wrapper they share live in the library module `synthgen.command_line`,
and the pieces of the application layer they share live here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from synthgen.command_line import HelpGroup, global_options, run

if TYPE_CHECKING:
    from synthgen.dp_plan import PrivacyPlan
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.release_plan import ReleasePlan


def group_app(help: str, **settings) -> typer.Typer:
    """A command group's app: `HelpGroup`'s help layout, and its help when run without a
    command; `settings` are typer's further ones."""
    return typer.Typer(cls=HelpGroup, help=help, no_args_is_help=True, **settings)


def tool_app(help: str) -> typer.Typer:
    """A tool's top-level app, whose callback is `global_options` (``--debug``, ``--version``)."""
    app = group_app(
        help,
        add_completion=False,
        pretty_exceptions_enable=False,
        # click's own help layout: option names are never cut (rich's table cuts them with
        # "…" below ~100 columns); the tree inherits the top-level app's mode
        rich_markup_mode=None,
    )
    app.callback()(global_options)
    return app


def console_script(app: typer.Typer) -> Callable[[], None]:
    """The console script (``main``) of the tool `app`: `run`'s exit code."""

    def main() -> None:
        sys.exit(run(app))

    return main


def admit_run(
    ledger: str | Path | None,
    scope: tuple[str, str],
    records: list,
    plan: ReleasePlan,
    *,
    stage: str,
    public_count: int,
    **admission,
) -> PrivacyLedger:
    """Admits a release of the private `records` for `scope` to the ledger at `ledger`
    (default: `default_ledger_path`) before any compute (`admit`, which also takes
    `admission`: budget, guarantees_add_up, check).

    Returns:
      The ledger the run is charged to.
    """
    from synthgen.paths import default_ledger_path
    from synthgen.privacy.admission import admit
    from synthgen.privacy.ledger import PrivacyLedger

    book = PrivacyLedger(ledger or default_ledger_path())
    admit(book, *scope, records, plan, stage=stage, public_count=public_count, **admission)
    return book


def admit_training_pairs(
    ledger: str | Path | None,
    scope: tuple[str, str],
    pairs: list[dict],
    plan: PrivacyPlan,
    **admission,
) -> PrivacyLedger:
    """`admit_run` of a DP training run on the private (document, query) `pairs` (stage
    "dp-train", n = the number of pairs), without a dry-run of the charge: the run checks
    its budget through its work folder, which knows a resume."""
    return admit_run(
        ledger, scope, pairs, plan, stage="dp-train", public_count=len(pairs), check=False,
        **admission,
    )  # fmt: skip


def print_guarantee(out: Path, steps: int, plan: PrivacyPlan, work: Path, **extra) -> None:
    """Prints a DP training run's guarantee (never its loss or timings) as one JSON line:
    `plan`'s epsilon, delta and noise multiplier, `extra`, and the secret work folder where it
    is kept (or left by an unfinished run to resume)."""
    summary = {
        "out": str(out),
        "steps": steps,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        **extra,
    }
    if work.exists():
        summary["work_dir"] = str(work)  # secret: kept, or an unfinished run to resume
    print(json.dumps(summary))

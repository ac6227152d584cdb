"""What both command lines build alike: the apps of the tools and their command groups, and a
DP training run's admission and summary.

`dpsynth.cli.synthgen` and `dpsynth.cli.retriever` never import each other; the option types,
validators and error wrapper they share live in the library module `synthgen.command_line`,
and the pieces of the application layer they share live here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from synthgen.command_line import HelpGroup, global_options

if TYPE_CHECKING:
    from synthgen.dp_plan import PrivacyPlan
    from synthgen.privacy.ledger import PrivacyLedger


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


def admit_training_pairs(
    ledger: str | Path,
    scope: tuple[str, str],
    pairs: list[dict],
    plan: PrivacyPlan,
    *,
    budget: float | None = None,
    guarantees_add_up: bool = False,
) -> PrivacyLedger:
    """Admits a DP training run on the private (document, query) `pairs` to the ledger at
    `ledger` for `scope` (stage "dp-train", n = the number of pairs), before any compute.

    The run checks its budget through its work folder, which knows a resume, so the
    admission does not dry-run the charge (`admit`'s ``check=False``).

    Returns:
      The ledger the run is charged to.
    """
    from synthgen.privacy.admission import admit
    from synthgen.privacy.ledger import PrivacyLedger

    book = PrivacyLedger(ledger)
    admit(
        book, *scope, pairs, plan, stage="dp-train", public_count=len(pairs), budget=budget,
        guarantees_add_up=guarantees_add_up, check=False,
    )  # fmt: skip
    return book


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

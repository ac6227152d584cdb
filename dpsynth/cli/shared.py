"""What both command lines build alike: the top-level app and a DP training run's summary.

`dpsynth.cli.synthgen` and `dpsynth.cli.retriever` never import each other; the option types,
validators and error wrapper they share live in the library module `synthgen.command_line`,
and the two pieces of the application layer they share live here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from synthgen.command_line import HelpGroup, global_options

if TYPE_CHECKING:
    from synthgen.dp_plan import PrivacyPlan


def tool_app(help: str) -> typer.Typer:
    """A tool's top-level app, whose callback is `global_options` (``--debug``, ``--version``)."""
    app = typer.Typer(
        cls=HelpGroup,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # click's own help layout: option names are never cut (rich's table cuts them with
        # "…" below ~100 columns); the tree inherits the top-level app's mode
        rich_markup_mode=None,
    )
    app.callback()(global_options)
    return app


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

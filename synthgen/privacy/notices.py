"""What a charging command tells its user on stderr: which ledger, and a weak guarantee.

Every command that charges a ledger says here, in the same words, which ledger holds the
charge and whether the command created it (`ledger_lines`: a new ledger is a new budget),
and warns, never refuses, when the guarantee asked for says little (`guarantee_lines`:
epsilon above `WEAK_EPSILON`, delta above 1 / (`DELTA_MARGIN` n)). See
docs/guides/privacy.md ("Which ledger, and weak settings"). The lines hold a location, a
collection name, epsilon, delta and n: nothing private.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synthgen.privacy.ledger import PrivacyLedger

WEAK_EPSILON = 10.0  # above this, e^epsilon (> 22000) bounds almost nothing
DELTA_MARGIN = 10  # delta <= 1 / (10 n): the few-shot and PE default, and the advice
_SLACK = 1e-9  # 1/(10 n) computed another way must not warn by a rounding


def ledger_location_line(ledger: PrivacyLedger, dataset: str) -> str:
    """The line that names the ledger holding `dataset`'s charges."""
    return f"ledger: collection {dataset} is charged in {ledger.location}"


def new_ledger_warning(
    ledger: PrivacyLedger, dataset: str, *, option: str | None = "--ledger"
) -> str | None:
    """The warning for a ledger file this `ledger` object created, else None.

    Args:
      ledger: the opened ledger (`PrivacyLedger.created`: True when it created the file).
      dataset: the collection the command charges.
      option: the command's ledger option, named in the way to keep one budget (None:
        the command has none, e.g. the main job's run folder).
    """
    if not ledger.created:
        return None
    hint = f" (pass {option} OLD to keep one budget)" if option else ""
    return (
        f"warning: created a new ledger at {ledger.location}: collection {dataset} starts "
        f"with a full budget here; charges in other ledgers are not counted{hint}"
    )


def ledger_lines(
    ledger: PrivacyLedger, dataset: str, *, option: str | None = "--ledger"
) -> list[str]:
    """`ledger_location_line`, then `new_ledger_warning` when the file is new."""
    warning = new_ledger_warning(ledger, dataset, option=option)
    return [ledger_location_line(ledger, dataset)] + ([warning] if warning else [])


def guarantee_lines(
    epsilon: float | None, delta: float | None, records: int | None, *, what: str | None = None
) -> list[str]:
    """Warnings for a weak (epsilon, delta) guarantee over `records` records; [] if none.

    Args:
      epsilon: the guarantee's epsilon (None or infinite: not stated here; a non-private
        run has its own warning).
      delta: its delta (None: not checked).
      records: n, the records the guarantee protects (the figure the command's delta
        bound uses: a declared public size where the command declares one).
      what: which guarantee, when a command states several (e.g. "per answer").

    Privacy:
      An (epsilon, delta)-DP mechanism may change the probability of any outcome by a
      factor e^epsilon, so beyond about 10 the bound is vacuous for most questions one
      asks about a record; and the mechanism that publishes each record outright with
      probability delta is (0, delta)-DP, so delta near 1/n allows publishing about
      n delta records (Dwork and Roth 2014, section 2.3).
    """
    label = f" ({what})" if what else ""
    lines = []
    if epsilon is not None and math.isfinite(epsilon) and epsilon > WEAK_EPSILON:
        factor = math.exp(epsilon) if epsilon < 700 else math.inf
        lines.append(
            f"warning: epsilon={epsilon:g}{label} is above {WEAK_EPSILON:g}: the guarantee is "
            f"weak (one record may change the odds of any outcome by a factor up to "
            f"e^epsilon = {factor:.3g}); choose epsilon <= {WEAK_EPSILON:g} unless this is "
            "deliberate"
        )
    if delta is not None and records is not None and records >= 1:
        bound = 1.0 / (DELTA_MARGIN * records)
        if delta > bound * (1 + _SLACK):
            lines.append(
                f"warning: delta={delta:g}{label} is near 1/n (n={records}): an (epsilon, "
                "delta)-DP release may publish each record outright with probability delta, "
                f"about n*delta = {records * delta:.2g} records in expectation; choose delta "
                f"well below 1/n, e.g. <= 1/({DELTA_MARGIN} n) = {bound:.3g}"
            )
    return lines


def tell(lines: Iterable[str]) -> None:
    """Prints each line on stderr (looked up at call time)."""
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def announce_ledger(ledger: PrivacyLedger, dataset: str) -> None:
    """Prints `ledger_lines` on stderr."""
    tell(ledger_lines(ledger, dataset))


def warn_weak_guarantee(
    epsilon: float | None,
    delta: float | None,
    records: int | None,
    *,
    what: str | None = None,
) -> None:
    """Prints `guarantee_lines` on stderr; prints nothing for a sound setting."""
    tell(guarantee_lines(epsilon, delta, records, what=what))

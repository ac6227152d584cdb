"""How the project writes a stated privacy spend for people: one rounding everywhere.

The ledger states a scope's spend as a float (`PrivacyLedger.spent`, a function of the
recorded events alone). Every place that shows it to a person (``synthgen ledger show``,
``retriever tenant list``, the service's ``/budget`` and its page) writes it with
`format_epsilon`: 4 decimals, rounded *up* (towards +inf) from the float's shortest
decimal form (``repr``, which reads back as the same float: 0.1 shows as 0.1000, not
0.1001), so a shown spend, read back as a float, is never below the stated one. What
remains of a cap is written with `format_remaining`: the cap less the shown spend, rounded
*down*, so the two shown figures add up to at most the cap and a shown remainder never
promises more than there is.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

DECIMALS = 4
_QUANTUM = Decimal(1).scaleb(-DECIMALS)


def format_epsilon(epsilon: float) -> str:
    """`epsilon` with `DECIMALS` decimals, rounded up (``inf`` for an unbounded spend).

    Args:
      epsilon: a stated spend (>= 0).

    Returns:
      e.g. ``"3.9667"`` for 3.96661; never a figure below `epsilon`.
    """
    epsilon = float(epsilon)
    if math.isnan(epsilon):
        raise ValueError(f"a spend cannot be nan, got {epsilon=}")
    if math.isinf(epsilon):
        return "inf" if epsilon > 0 else "-inf"
    return str(Decimal(repr(epsilon)).quantize(_QUANTUM, rounding=ROUND_CEILING))


def format_remaining(epsilon_cap: float, epsilon: float) -> str:
    """What remains of `epsilon_cap` after the shown spend `format_epsilon(epsilon)`,
    rounded down and at least 0, with `DECIMALS` decimals."""
    shown = format_epsilon(epsilon)
    if shown == "inf":
        return str(Decimal(0).quantize(_QUANTUM))
    remaining = Decimal(repr(float(epsilon_cap))) - Decimal(shown)
    return str(max(Decimal(0), remaining).quantize(_QUANTUM, rounding=ROUND_FLOOR))


def format_left(epsilon: float) -> str:
    """A remaining epsilon known only as a float (no cap at hand), rounded *down* with
    `DECIMALS` decimals and at least 0: never more than there is."""
    epsilon = float(epsilon)
    if math.isnan(epsilon):
        raise ValueError(f"a remainder cannot be nan, got {epsilon=}")
    if math.isinf(epsilon):
        return "inf" if epsilon > 0 else str(Decimal(0).quantize(_QUANTUM))
    left = Decimal(repr(epsilon)).quantize(_QUANTUM, rounding=ROUND_FLOOR)
    return str(max(Decimal(0).quantize(_QUANTUM), left))


def round_up(value: float, digits: int) -> float:
    """`value` rounded up to `digits` significant digits: a stated ε or δ written with
    ``:.{digits}g`` then never reads below the figure it states (0, inf: as they are)."""
    if not math.isfinite(value) or value <= 0:
        return value
    quantum = Decimal(1).scaleb(math.floor(math.log10(value)) - digits + 1)
    return float(Decimal(repr(float(value))).quantize(quantum, rounding=ROUND_CEILING))

"""Calibration: the one place a DP parameter is fitted to a budget.

Two tools, and every calibration of the toolkit calls one of them:

- `calibrate_event`: the parameter of a mechanism that is a dp_accounting event (DP-SGD's
  noise multiplier), by `dp_accounting.calibrate_dp_mechanism` over an explicit bracket;
- `bisect` (with `grow` to find its bracket): the bounded search for what is not one event
  or whose callers state values on another grid: a zCDP cap, a composition rule of DP-RAG,
  the fewest records a threshold needs, a plan's largest per-answer epsilon. It halves the
  interval between a feasible and an infeasible point of a monotone rule and returns the
  feasible end, so the answer is always on the safe side of the rule it was given.

Privacy:
  Reads public parameters only; the guarantee is the rule's (`feasible`) or the event's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting
from dp_accounting import dp_event
from dp_accounting import mechanism_calibration as dp_calibration


def grow(
    condition: Callable[[float], bool],
    low: float,
    high: float,
    *,
    limit: float = math.inf,
    error: str = "no value in range meets the target",
) -> tuple[float, float]:
    """Doubles the bracket, ``(low, high) -> (high, 2 high)``, while `condition(high)`.

    Raises:
      ValueError(`error`): `high` passed `limit` first.
    """
    while condition(high):
        low, high = high, high * 2
        if high > limit:
            raise ValueError(error)
    return low, high


def bisect(
    feasible: Callable[[float], bool],
    good: float,
    bad: float,
    *,
    geometric: bool = False,
    integer: bool = False,
    rel_tol: float = 0.0,
    abs_tol: float = 0.0,
    iterations: int = 10_000,
) -> float:
    """The feasible end after halving ``[good, bad]`` (either order) around the boundary.

    `feasible` is monotone on the interval, `feasible(good)` holds and `feasible(bad)` does
    not (the caller's bracket: not evaluated here). Halves at the arithmetic midpoint, the
    geometric one (`geometric`, positive ends) or the integer one (`integer`: the smallest
    or largest feasible integer). Stops after `iterations` halvings or once the ends are within
    ``max(abs_tol, rel_tol * min(|good|, |bad|))`` (integers: adjacent).

    Returns:
      `good`'s last value: feasible, within the tolerance of the boundary.
    """
    for _ in range(iterations):
        gap = abs(good - bad)
        if (integer and gap <= 1) or gap <= max(abs_tol, rel_tol * min(abs(good), abs(bad))):
            break
        if integer:
            mid = (good + bad) // 2
        elif geometric:
            mid = math.sqrt(good * bad)
        else:
            mid = (good + bad) / 2
        if feasible(mid):
            good = mid
        else:
            bad = mid
    return good


def calibrate_event(
    make_event: Callable[[float], dp_event.DpEvent],
    make_accountant: Callable[[], dp_accounting.PrivacyAccountant],
    *,
    target_epsilon: float,
    delta: float,
    lower: float,
    upper: float,
    tol: float,
) -> float:
    """The parameter in ``[lower, upper]`` (a bracket whose ends fall on either side of the
    target) at which `make_event`'s epsilon at `delta` meets `target_epsilon`, within `tol`,
    by dp_accounting's `calibrate_dp_mechanism` (Brent's method, then its safe side on the
    accountant it was given)."""
    return float(
        dp_calibration.calibrate_dp_mechanism(
            make_accountant,
            make_event,
            target_epsilon,
            delta,
            bracket_interval=dp_calibration.ExplicitBracketInterval(lower, upper),
            tol=tol,
        )
    )

"""What an audited run claims: the epsilon of each run and of each repetitions group.

A generator that is (eps, delta)-DP for one example is, for a canary repeated r times
(r examples), (r eps, r e^{(r-1) eps} delta)-DP by group privacy; the claim is vacuous
(epsilon = inf) once that delta reaches 1. Audits compare a group's empirical lower bounds
with this claim.

References: Dwork & Roth 2014, Theorem 2.2 (group privacy).
"""

from __future__ import annotations

import math


def epsilon_tag(epsilon: float) -> str:
    """A file-name tag of a run's epsilon: "inf" or e.g. "8"."""
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def parse_epsilons(text: str) -> tuple[float, ...]:
    """'inf,16,8,3' -> (inf, 16.0, 8.0, 3.0); each > 0."""
    values = []
    for part in text.split(","):
        part = part.strip().lower()
        value = math.inf if part in ("inf", "infinity", "∞") else float(part)
        if not value > 0:
            raise ValueError(f"epsilons must be > 0 or inf, got {part!r}")
        values.append(value)
    if not values:
        raise ValueError("no epsilon given")
    return tuple(values)


def group_claim(epsilon: float, delta: float, repetitions: int) -> tuple[float, float]:
    """Group privacy for `repetitions` copies: (r eps, r e^{(r-1)eps} delta); inf if vacuous."""
    if repetitions < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions=}")
    if math.isinf(epsilon) or repetitions == 1:
        return epsilon, delta
    if delta == 0:
        return repetitions * epsilon, 0.0
    log_delta = math.log(repetitions) + (repetitions - 1) * epsilon + math.log(delta)
    if log_delta >= 0:
        return math.inf, delta  # the group guarantee is vacuous
    return repetitions * epsilon, math.exp(log_delta)

"""DP few-shot generation accounting (Tang et al. 2024): events, epsilon, calibration.

Holds the aggregation mechanisms and resampling modes (`FEWSHOT_MECHANISMS`,
`FEWSHOT_RESAMPLING`), the amplification of a pure-DP mechanism by Poisson subsampling
(`amplified_pure_epsilon`), the event of releasing tokens by DP few-shot aggregation
(`fewshot_event`), its epsilon (`fewshot_epsilon`) and its noise calibration
(`calibrate_fewshot`), on the events of `events.py` and the accountants of `accountants.py`.
"""

from __future__ import annotations

import math
from typing import Any

from dp_accounting import dp_event

from synthgen.privacy import calibration
from synthgen.privacy.accountants import (
    MIN_NOISE_MULTIPLIER,
    PldAccountant,
    _quiet_absl,
    epsilon,
)
from synthgen.privacy.events import (
    NeighboringRelation,
    check_open_delta,
    gaussian_event,
    poisson_sampled,
    pure_epsilon_event,
    self_composed,
)

FEWSHOT_MECHANISMS: tuple[str, ...] = ("gaussian", "rnm")
FEWSHOT_RESAMPLING: tuple[str, ...] = ("token", "example")


def amplified_pure_epsilon(epsilon: float, sampling_rate: float) -> float:
    """Epsilon of an epsilon-DP mechanism run on a Poisson subsample of rate q.

    log(1 + q (e^epsilon - 1)) under add/remove-one (Balle, Barthe & Gaboardi 2018, Thm 8).
    """
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate=}")
    # = epsilon + log(q + (1 - q) e^-epsilon): no overflow for large epsilon.
    q = sampling_rate
    return epsilon + math.log(q + (1 - q) * math.exp(-epsilon))


def fewshot_event(
    *,
    sampling_rate: float,
    tokens: int,
    mechanism: str = "gaussian",
    noise_multiplier: float | None = None,
    token_epsilon: float | None = None,
    tokens_per_draw: int = 1,
) -> dp_event.DpEvent:
    """The DpEvent of releasing `tokens` tokens by DP few-shot aggregation.

    Each draw is a Poisson subsample (rate `sampling_rate`, add/remove-one) of the private
    examples, used for `tokens_per_draw` consecutive released tokens (1: a fresh draw per
    token, as in Tang et al.; the token limit of a synthetic example: one draw per example).
    Per token, `gaussian` adds N(0, (sigma * sqrt(2) / M)^2) to the mean of M next-token
    distributions (L2 sensitivity sqrt(2)/M), so one token is a Gaussian mechanism of noise
    multiplier sigma, and `tokens_per_draw` tokens on one draw are one Gaussian mechanism of
    multiplier sigma / sqrt(tokens_per_draw) (Gaussian composition is exact). `rnm` is the
    exponential mechanism with `token_epsilon` per token; a draw is
    (tokens_per_draw * token_epsilon)-DP, amplified by `amplified_pure_epsilon`.
    `tokens` is rounded up to whole draws.
    """
    if tokens < 1 or tokens_per_draw < 1:
        raise ValueError(
            f"tokens and tokens_per_draw must be >= 1, got {tokens=} {tokens_per_draw=}"
        )
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate=}")
    draws = math.ceil(tokens / tokens_per_draw)
    if mechanism == "gaussian":
        if noise_multiplier is None or not noise_multiplier > 0:
            raise ValueError(f"gaussian needs noise_multiplier > 0, got {noise_multiplier=}")
        per_draw = gaussian_event(noise_multiplier / math.sqrt(tokens_per_draw))
        return self_composed(poisson_sampled(sampling_rate, per_draw), draws)
    if mechanism == "rnm":
        if token_epsilon is None or not token_epsilon > 0:
            raise ValueError(f"rnm needs token_epsilon > 0, got {token_epsilon=}")
        eps = amplified_pure_epsilon(token_epsilon * tokens_per_draw, sampling_rate)
        return self_composed(pure_epsilon_event(eps), draws)
    raise ValueError(f"mechanism must be one of {FEWSHOT_MECHANISMS}, got {mechanism=}")


def fewshot_epsilon(delta: float, **event_args: Any) -> float:
    """Epsilon (PLD, add/remove-one) of `fewshot_event(**event_args)` at `delta`."""
    return epsilon(fewshot_event(**event_args), delta)


def calibrate_fewshot(
    *, target_epsilon: float, delta: float, tolerance: float = 1e-3, **event_args: Any
) -> float:
    """The noise parameter making `fewshot_event(**event_args)` (target_epsilon, delta)-DP.

    Returns the smallest sigma (``gaussian``) or the largest per-token epsilon (``rnm``),
    within `tolerance`, on the safe side. `event_args` are those of `fewshot_event` without
    the noise parameter.
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be positive, got {target_epsilon=}")
    check_open_delta(delta)
    mechanism = event_args.get("mechanism", "gaussian")
    name = "noise_multiplier" if mechanism == "gaussian" else "token_epsilon"

    increasing = name == "token_epsilon"

    def eps_of(value: float, interval: float = 1e-4 if increasing else 1e-3) -> float:
        # Gaussian: a coarse PLD grid for the search (10x faster), the default for the answer.
        acc = PldAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE, interval)
        with _quiet_absl():
            acc.compose(fewshot_event(**event_args, **{name: value}))
            return float(acc.get_epsilon(delta))

    # Bisection in log space on a monotone rule: epsilon falls with sigma and rises with the
    # per-token epsilon. Very small sigmas make the PLD grid explode: a target reachable
    # with less noise than MIN_NOISE_MULTIPLIER gets that floor (more noise, never less).
    def fits(value: float) -> bool:
        return eps_of(value) <= target_epsilon

    floor = 1e-6 if increasing else MIN_NOISE_MULTIPLIER
    if not increasing and fits(floor):
        value = floor
    else:
        lo, hi = calibration.grow(
            lambda x: fits(x) == increasing,
            floor,
            1.0,
            limit=1e4,
            error=f"no {name} in range reaches {target_epsilon=}",
        )
        if increasing and not fits(lo):
            raise ValueError(f"{target_epsilon=} is below what any per-token epsilon >= 1e-6 gives")
        good, bad = (lo, hi) if increasing else (hi, lo)
        value = calibration.bisect(fits, good, bad, geometric=True, rel_tol=tolerance)
    while eps_of(value, 1e-4) > target_epsilon:  # the answer, on the safe side
        value = value / (1 + tolerance) if increasing else value * (1 + tolerance)
    return float(value)

"""Per-answer privacy accounting of the DP-RAG answer stage.

An answer releases a retrieval threshold (exponential mechanism, pure epsilon_r), up to T
tokens (exponential mechanism: eps0-DP and eps0-bounded-range, BR) and optionally a Laplace
score (pure). Privacy unit: one document; add/remove-one. ``pure`` composes every release
with PLD (Grislain 2024). ``bounded-range``: an eps0-BR pair is a post-processing of the
binary pair RR_t with losses t and t - eps0, t in [0, eps0] (Dong, Durfee & Rogers 2020,
DDR). Decoding is *adaptive* (step j's t depends on the prefix), and DDR's optimal
formula (`adaptive=False`) holds only for mechanisms fixed in advance (T=2, eps0=1: TV
0.2883, while t1=0.5, then t2=0.25 after loss +0.5 and 0.75 after -0.5, reaches 0.3034).
The default (`adaptive=True`) is the least of three sound bounds: (a) PLD of the T-fold
product of the pair whose profile is sup_t delta_{RR_t}, which dominates every eps0-BR pair
both ways, so f-DP composition (Dong, Roth & Su 2022, Thm 3.2) covers adaptive choices; (b)
eps0^2/8-zCDP per token (Cesar & Rogers 2021) through dp-accounting's RDP conversion; (c)
basic composition T * eps0. See docs/guides/dp_rag.md ("Per-answer accounting").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy.special import gammaln, logsumexp

from synthgen.privacy import accounting, calibration

Composition = Literal["pure", "bounded-range"]
COMPOSITIONS: tuple[str, ...] = ("pure", "bounded-range")
VALUE_DISCRETIZATION = 1e-4  # PLD grid of the bounded-range envelope, as dp-accounting's default
_RDP_ORDERS = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=float)


def _check(name: str, value: float, tokens: int, delta: float | None = None) -> None:
    """Validates a positive finite epsilon `name`=`value`, `tokens` and (if given) `delta`."""
    if isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value < math.inf):
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int | np.integer) or tokens < 1:
        raise ValueError(f"tokens must be an integer >= 1, got {tokens=}")
    if delta is not None and not (isinstance(delta, int | float) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta=}")


def _pure_parts(retrieval_epsilon: float, extra_pure: Sequence[float]) -> list[float]:
    parts = [retrieval_epsilon, *extra_pure]
    if not all(isinstance(v, int | float) and 0 <= v < math.inf for v in parts):
        raise ValueError(f"pure epsilons must be finite and >= 0, got {parts=}")
    return [float(v) for v in parts if v > 0]


def pure_tokens_epsilon(
    token_epsilon: float,
    tokens: int,
    delta: float,
    *,
    retrieval_epsilon: float = 0.0,
    extra_pure: Sequence[float] = (),
) -> float:
    """Epsilon at `delta` of T pure token releases plus the other pure releases (PLD).

    Args:
      token_epsilon, tokens, delta: eps0, T (every planned token is paid), target delta.
      retrieval_epsilon, extra_pure: the threshold's epsilon (0: none), other pure releases.

    Returns:
      The (pessimistic) PLD epsilon, never above basic composition.

    Raises:
      ValueError: on an invalid parameter.

    Privacy:
      Add/remove one document. Every release is pure DP, dominated by randomized response
      even when chosen adaptively (Kairouz, Oh & Viswanath 2015).

    References:
      Grislain 2024, "RAG with differential privacy"; Kairouz, Oh & Viswanath 2015.
    """
    _check("token_epsilon", token_epsilon, tokens, delta)
    others = _pure_parts(retrieval_epsilon, extra_pure)
    events = [accounting.self_composed(accounting.pure_epsilon_event(token_epsilon), tokens)]
    events += [accounting.pure_epsilon_event(e) for e in others]
    pld = accounting.epsilon(accounting.compose(events), delta)
    return min(pld, tokens * token_epsilon + sum(others))


def _nonadaptive_delta(eps0: float, k: int, eps_g: float) -> float:
    """Dong, Durfee & Rogers' optimal delta of k non-adaptive eps0-BR mechanisms.

    delta(t) = sum_i C(k,i) a^(k-i) (1-a)^i (1 - e^(eps_g - kt + i eps0))_+, a = (e^eps0 -
    e^t)/(e^eps0 - 1): k copies of RR_t. Between breakpoints t = (eps_g + m eps0)/k the terms
    are fixed and d delta/dt > 0 iff (k+1) t < eps_g + (m+1) eps0, so the max over [0, eps0]
    is at some t_m = (eps_g + (m+1) eps0)/(k+1). Evaluating every t_m and breakpoint (each
    feasible) gives the exact maximum; log space, vectorised.
    """
    m = np.arange(k + 1)
    t = np.concatenate([(eps_g + (m[1:]) * eps0) / (k + 1), (eps_g + m * eps0) / k])
    t = np.append(t[(t > 0) & (t < eps0)], eps0 / 2)  # any feasible t may be added
    log_norm = math.log(-math.expm1(-eps0))
    log_a = np.log(-np.expm1(t - eps0)) - log_norm  # P(loss = t)
    log_1ma = t - eps0 + np.log(-np.expm1(-t)) - log_norm  # P(loss = t - eps0)
    excess = eps_g - (k * t[:, None] - m[None, :] * eps0)
    log_comb = gammaln(k + 1) - gammaln(m + 1) - gammaln(k - m + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_gap = np.where(excess < 0, np.log(-np.expm1(np.minimum(excess, 0.0))), -np.inf)
        log_terms = log_comb + (k - m) * log_a[:, None] + m * log_1ma[:, None] + log_gap
        return float(np.exp(logsumexp(log_terms, axis=1)).max())


def _adaptive(eps0: float, tokens: int) -> tuple[pld_lib.PrivacyLossDistribution, np.ndarray]:
    """The T-fold envelope PLD (of the pair dominating every eps0-BR pair) and the RDP curve
    of T eps0^2/8-zCDP mechanisms."""
    envelope = accounting.bounded_range_pld(eps0, VALUE_DISCRETIZATION)
    return envelope.self_compose(int(tokens)), _RDP_ORDERS * tokens * eps0**2 / 8


def bounded_range_delta(
    token_epsilon: float, tokens: int, epsilon_g: float, *, adaptive: bool = True
) -> float:
    """Delta at `epsilon_g` of T composed token_epsilon-bounded-range mechanisms.

    Args, Privacy and References as `bounded_range_epsilon`; `epsilon_g` >= 0 is the total.
    """
    _check("token_epsilon", token_epsilon, tokens)
    if not (isinstance(epsilon_g, int | float) and 0 <= epsilon_g < math.inf):
        raise ValueError(f"epsilon_g must be finite and >= 0, got {epsilon_g=}")
    if epsilon_g >= tokens * token_epsilon:  # basic composition
        return 0.0
    if not adaptive:
        return _nonadaptive_delta(float(token_epsilon), int(tokens), float(epsilon_g))
    pld, rdp = _adaptive(token_epsilon, tokens)
    rdp_delta, _ = rdp_lib.compute_delta(_RDP_ORDERS, rdp, epsilon_g)
    return float(min(pld.get_delta_for_epsilon(epsilon_g), rdp_delta))


def bounded_range_epsilon(
    token_epsilon: float, tokens: int, delta: float, *, adaptive: bool = True
) -> float:
    """Smallest epsilon such that T token_epsilon-BR mechanisms are (epsilon, delta)-DP.

    Args:
      token_epsilon, tokens, delta: eps0 (each mechanism's BR parameter), T, target delta.
      adaptive: True (keep it for decoding): valid when a mechanism depends on earlier
        outputs. False: DDR's exact optimum for mechanisms fixed in advance (bisection on
        the decreasing delta(eps), rounded up; O(T^2)); NOT valid for decoding.

    Returns:
      An upper bound on epsilon (the non-adaptive optimum itself when not adaptive).

    Raises:
      ValueError: on an invalid parameter.

    Privacy:
      Add/remove one document; each token's mechanism is eps0-BR (module docstring).

    References:
      Dong, Durfee & Rogers 2020 (DDR), "Optimal differential privacy composition for
      exponential mechanisms and the cost of adaptivity" (ICML; arXiv:1909.13830); Cesar &
      Rogers 2021; Dong, Roth & Su 2022; Canonne, Kamath & Steinke 2020 (RDP conversion).
    """
    _check("token_epsilon", token_epsilon, tokens, delta)
    basic = tokens * token_epsilon
    if adaptive:
        pld, rdp = _adaptive(token_epsilon, tokens)
        rdp_eps, _ = rdp_lib.compute_epsilon(_RDP_ORDERS, rdp, delta)
        return float(min(pld.get_epsilon_for_delta(delta), rdp_eps, basic))
    return float(
        calibration.bisect(
            lambda eps: _nonadaptive_delta(token_epsilon, int(tokens), eps) <= delta,
            basic,
            0.0,
            rel_tol=1e-7,
            abs_tol=1e-7,
        )
    )


def _total(eps0: float, tokens: int, delta: float, others: list[float], composition: str) -> float:
    if composition == "pure":
        return pure_tokens_epsilon(eps0, tokens, delta, extra_pure=others)
    return sum(others) + bounded_range_epsilon(eps0, tokens, delta)


def calibrate_token_epsilon(
    target_epsilon: float,
    tokens: int,
    delta: float,
    *,
    retrieval_epsilon: float = 0.0,
    extra_pure: Sequence[float] = (),
    composition: Composition = "pure",
) -> float:
    """Largest per-token epsilon (within 1e-4 relative) keeping the answer within target.

    "pure": `pure_tokens_epsilon(...) <= target`. "bounded-range": retrieval_epsilon +
    sum(extra_pure) + bounded_range_epsilon(eps0, T, delta) <= target (basic composition of
    the pure releases with the token block). Log-space bisection; the result is checked.

    Args:
      target_epsilon, tokens, delta: the answer's target epsilon and delta, its most tokens T.
      retrieval_epsilon, extra_pure: the pure releases (threshold; e.g. the score).
      composition: "pure" or "bounded-range" (above).

    Returns:
      eps0, on the safe side (its total is <= target_epsilon).

    Raises:
      ValueError: on an invalid parameter, or if the pure releases use up the target.

    Privacy:
      Add/remove one document; the total bounds the answer's epsilon at `delta`.

    References:
      Grislain 2024, "RAG with differential privacy"; Dong, Durfee & Rogers 2020.
    """
    _check("target_epsilon", target_epsilon, tokens, delta)
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition=}")
    others = _pure_parts(retrieval_epsilon, extra_pure)
    budget = target_epsilon - sum(others)
    if budget <= 0:
        raise ValueError(f"the pure releases use up the target: {others=} {target_epsilon=}")

    def ok(x: float) -> bool:
        return _total(x, tokens, delta, others, composition) <= target_epsilon

    low = budget / tokens  # feasible: both totals are at most basic composition
    while not ok(low):  # only float rounding can make it infeasible
        low /= 1 + 1e-4
    low, high = calibration.grow(
        ok,
        low,
        2 * low,
        limit=1e3 * target_epsilon,
        error=f"no token epsilon bounds the total for {target_epsilon=}",
    )
    return float(calibration.bisect(ok, low, high, geometric=True, rel_tol=1e-4))


def rag_privacy_plan(
    tokens: int,
    delta: float,
    target_epsilon: float,
    *,
    retrieval_epsilon: float = 0.0,
    score_epsilon: float = 0.0,
    composition: Composition = "pure",
) -> dict[str, Any]:
    """The calibrated per-token epsilon of one answer and the answer's actual total.

    What `retriever privacy rag --json` prints. Args and Raises as `calibrate_token_epsilon`;
    `score_epsilon` is the Laplace score's (0: none), composed as a pure release.

    Returns:
      JSON-ready dict: token_epsilon, epsilon (the total, <= target_epsilon), delta, tokens,
      retrieval_epsilon, score_epsilon, composition, target_epsilon.

    Privacy:
      Add/remove one document; see `calibrate_token_epsilon` and its references.
    """
    extra = (score_epsilon,) if score_epsilon else ()
    kwargs = dict(retrieval_epsilon=retrieval_epsilon, extra_pure=extra, composition=composition)
    token_epsilon = calibrate_token_epsilon(target_epsilon, tokens, delta, **kwargs)
    total = _total(token_epsilon, tokens, delta, _pure_parts(retrieval_epsilon, extra), composition)
    plan = dict(composition=composition, tokens=int(tokens), delta=float(delta), epsilon=total)
    plan.update(token_epsilon=token_epsilon, target_epsilon=float(target_epsilon))
    plan.update(retrieval_epsilon=float(retrieval_epsilon), score_epsilon=float(score_epsilon))
    return plan

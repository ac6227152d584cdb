"""Individual privacy filters: each document pays only for the releases it took part in.

In individual mode each document has its own running privacy loss (Feldman & Zrnic 2021,
"Individual privacy accounting via a Rényi filter"), kept as a zCDP parameter rho (Bun &
Steinke 2016): the linear RDP curve D_alpha <= alpha * rho at every order at once, stated as
(epsilon, delta) only when asked. A pure epsilon-DP release costs epsilon^2 / 2
(`pure_rho`), an epsilon-bounded-range one epsilon^2 / 8 (`bounded_range_rho`);
compositions add. An (epsilon, delta > 0) release has no zCDP curve, so such answers
(DP-RAG's keywords and facts) run in collection mode only
(`retriever.rag.plan.AnswerPlan.document_rho` refuses them). See docs/guides/dp_rag.md
("Per-document accounting").
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from synthgen.privacy import calibration

# Orders over which a rho is stated as (epsilon, delta): dp-accounting's default grid plus
# larger ones (small rho and small delta are optimised at large alpha).
RDP_ORDERS = np.unique(np.concatenate([rdp_lib.DEFAULT_RDP_ORDERS, [512.0, 1024.0, 4096.0]]))


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}")
    return float(value)


def _delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    return float(delta)


def pure_rho(epsilon: float) -> float:
    """rho of one pure epsilon-DP release: epsilon^2 / 2 (Bun & Steinke 2016, Prop. 1.4)."""
    return _positive("epsilon", epsilon) ** 2 / 2.0


def bounded_range_rho(epsilon: float) -> float:
    """rho of one epsilon-bounded-range release (the exponential mechanism at epsilon):
    epsilon^2 / 8 (Cesar & Rogers 2021, "Bounding, concentrating, and truncating", Lemma 3.2)."""
    return _positive("epsilon", epsilon) ** 2 / 8.0


def rho_epsilon(rho: float, delta: float) -> float:
    """The epsilon at `delta` of rho-zCDP, optimised over `RDP_ORDERS` (dp-accounting's RDP
    conversion, tighter than rho + 2 sqrt(rho log 1/delta))."""
    delta = _delta(delta)
    if isinstance(rho, bool) or not isinstance(rho, int | float) or not 0 <= rho < math.inf:
        raise ValueError(f"rho must be finite and >= 0, got {rho=}")
    if rho == 0:
        return 0.0
    epsilon, _ = rdp_lib.compute_epsilon(RDP_ORDERS, RDP_ORDERS * float(rho), delta)
    return float(epsilon)


@functools.lru_cache(maxsize=256)
def rho_cap(epsilon: float, delta: float, iterations: int = 200) -> float:
    """The largest rho whose `rho_epsilon` at `delta` is at most `epsilon` (bisection; cached:
    a ledger reads a collection's cap on every charge).

    Raises:
      ValueError: epsilon not finite and > 0, or delta not in (0, 1).
    """
    epsilon, delta = _positive("epsilon", epsilon), _delta(delta)
    # rho_epsilon(rho) >= rho, so rho = epsilon is too large
    return calibration.bisect(
        lambda rho: rho_epsilon(rho, delta) <= epsilon,
        0.0,
        epsilon,
        rel_tol=1e-15,
        iterations=iterations,
    )


@dataclasses.dataclass(frozen=True)
class DocumentBudget:
    """Each document's (epsilon, delta) target and the rho cap its filter enforces.

    Attributes:
      epsilon: the per-document epsilon target (> 0, finite).
      delta: the per-document delta (in (0, 1); e.g. 1e-6).
      rho_cap: the largest rho whose statement at `delta` is at most `epsilon` (derived).

    Privacy:
      Individual Rényi filter (Feldman & Zrnic 2021, Thm 3.3; fully adaptive composition,
      Whitehouse et al. 2023): releases are chosen adaptively, document i's loss in release
      t is rho_t(i) (0 when i cannot change the release), and i is excluded from every
      release whose rho_t(i) would bring its running sum past `rho_cap`. Then for every
      order alpha the RDP of the whole interaction towards i is at most alpha * rho_cap, the
      filter's budget at that order (the stopping rule is the same at every alpha), so each
      document is rho_cap-zCDP and (epsilon, delta)-DP by the RDP conversion, over every
      release anyone asked, however adaptively. Excluding a document depends on its own
      losses only, which the theorem allows.
    """

    epsilon: float
    delta: float
    rho_cap: float = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho_cap", rho_cap(self.epsilon, self.delta))

    def fits(self, spent_rho: float, charge_rho: float) -> bool:
        """Whether a document that has spent `spent_rho` can pay `charge_rho` more (no float
        slack: a sum that rounds past the cap is refused, the sound side)."""
        return spent_rho + charge_rho <= self.rho_cap

    def spent_epsilon(self, spent_rho: float) -> float:
        """A document's spend as epsilon at this budget's delta."""
        return rho_epsilon(spent_rho, self.delta)

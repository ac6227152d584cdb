"""Privacy accountants: a composition of events stated as one (epsilon, delta) guarantee.

Holds dp-accounting's PLD (default, tight) and RDP accountants extended to the event types
of `events.py` (`PldAccountant`, `RdpAccountant`, `make_accountant`), the PLD of the pair
dominating every epsilon-bounded-range pair (`bounded_range_pld`), and `epsilon`: the
smallest epsilon of an event at a delta. The noise calibrations built on them live with
their mechanisms (`dpsgd_accounting.py`, `fewshot_accounting.py`); `MIN_NOISE_MULTIPLIER`
is their common floor.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator
from typing import Literal

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from synthgen.privacy.errors import UnsupportedEventError
from synthgen.privacy.events import (
    BoundedRangeDpEvent,
    EpsilonDeltaDpEvent,
    FixedSizeSampledGaussianDpEvent,
    NeighboringRelation,
    check_open_delta,
)

AccountantKind = Literal["pld", "rdp"]
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
MIN_NOISE_MULTIPLIER = 0.3


def bounded_range_pld(
    epsilon: float, value_discretization_interval: float = 1e-4
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """Pessimistic PLD of the pair dominating every epsilon-BR pair, in both directions.

    Its profile is sup_t delta_{RR_t}(e) = (1 - e^(-(eps - e)/2))^2 / (1 - e^-eps) on
    [0, eps] (at t = (eps + e)/2), where RR_t is the binary pair with losses t and t - eps:
    P(L > s) = (1 - u)/(1 - e^-eps), ``u = e^((|s| - eps)/2)``, for s >= 0, and
    P(L <= -s) = Q(L > s) (symmetric). Mass on ((j-1)h, jh] goes to jh (rounded up).

    References:
      Dong, Durfee & Rogers 2020 (arXiv:1909.13830), Lemma 3.1 (BR pairs are post-processings
      of RR_t).
    """
    h = value_discretization_interval
    if epsilon == 0:
        return privacy_loss_distribution.identity(h)
    n = math.ceil(epsilon / h)
    s = np.clip(np.arange(-n, n + 1) * h, -epsilon, epsilon)
    u = np.exp((np.abs(s) - epsilon) / 2)
    cdf = np.where(s < 0, np.exp(s) * u * (1 - u), u - math.exp(-epsilon))
    cdf = cdf / -math.expm1(-epsilon)
    pmf = {j: float(p) for j, p in zip(range(-n + 1, n + 1), np.diff(cdf)) if p > 0}
    return privacy_loss_distribution.PrivacyLossDistribution.create_from_rounded_probability(
        pmf, 0.0, h
    )


@functools.lru_cache(maxsize=16)  # one entry is a few MB at small sigma on the 1e-4 grid
def subsampled_gaussian_pld(
    noise_multiplier: float,
    sampling_prob: float,
    value_discretization_interval: float,
    relation: NeighboringRelation,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """dp-accounting's PLD of one (Poisson-)subsampled Gaussian step, memoised.

    Building it is the slow part of DP-SGD accounting (seconds at small sigma on the 1e-4
    grid), and a run states it many times with the same arguments: the plan, every step's
    progress, the ledger's charge check. Composition never mutates a PLD, so one object
    serves every caller.
    """
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        value_discretization_interval=value_discretization_interval,
        sampling_prob=sampling_prob,
        neighboring_relation=relation,
    )


class PldAccountant(pld_privacy_accountant.PLDAccountant):
    """dp-accounting's PLD accountant that also composes `EpsilonDeltaDpEvent`,
    `BoundedRangeDpEvent` and `FixedSizeSampledGaussianDpEvent` (and builds each
    subsampled-Gaussian step's PLD once per process: `subsampled_gaussian_pld`)."""

    def _maybe_compose(self, event, count, do_compose):
        replace_one = self.neighboring_relation == NeighboringRelation.REPLACE_ONE
        if isinstance(event, FixedSizeSampledGaussianDpEvent) and not replace_one:
            return self.CompositionErrorDetails(
                invalid_event=event,
                error_message="fixed-size batches are analysed under REPLACE_ONE only",
            )
        composed = self._own_pld(event, replace_one)
        if composed is None:
            return super()._maybe_compose(event, count, do_compose)
        if do_compose:
            self._pld = self._pld.compose(composed(count))
        return None

    def _own_pld(self, event, replace_one: bool):
        """count -> the PLD of `count` copies of `event`, for the events composed here
        (None: dp-accounting's own)."""
        h = self._value_discretization_interval
        if (
            isinstance(event, dp_event.PoissonSampledDpEvent)
            and isinstance(event.event, dp_event.GaussianDpEvent)
            and event.sampling_probability > 0
            and event.event.noise_multiplier > 0
        ):  # dp-accounting's own branch, with the one-step PLD memoised
            sigma, q = float(event.event.noise_multiplier), float(event.sampling_probability)
            return lambda count: subsampled_gaussian_pld(
                sigma, q, h, self.neighboring_relation
            ).self_compose(count)
        if isinstance(event, BoundedRangeDpEvent):
            return lambda count: bounded_range_pld(event.epsilon, h).self_compose(count)
        if isinstance(event, EpsilonDeltaDpEvent):
            params = privacy_loss_distribution.common.DifferentialPrivacyParameters
            return lambda count: privacy_loss_distribution.from_privacy_parameters(
                params(epsilon=event.epsilon, delta=event.delta), value_discretization_interval=h
            ).self_compose(count)
        # Replace-one Gaussian/Laplace: the multiplier is relative to the replace-one
        # sensitivity, as in the RDP accountant (dp-accounting's PLD would compare N(-1)
        # with N(+1), doubling it), so one event means the same under both accountants.
        if replace_one and isinstance(event, dp_event.GaussianDpEvent):
            return lambda count: privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=event.noise_multiplier / math.sqrt(count),
                value_discretization_interval=h,
            )
        if replace_one and isinstance(event, dp_event.LaplaceDpEvent):
            return lambda count: privacy_loss_distribution.from_laplace_mechanism(
                event.noise_multiplier, value_discretization_interval=h
            ).self_compose(count)
        if isinstance(event, FixedSizeSampledGaussianDpEvent):
            # Both orders of N(0, s^2) vs (1-q) N(0, s^2) + q N(2, s^2): dp-accounting's
            # add/remove pair of the subsampled Gaussian with multiplier sigma / 2. Each
            # order is composed with itself and the worse total is stated; with adaptive
            # steps the worse order may change from step to step, which the per-direction
            # composition is taken to cover (checked numerically on mixed orders; the
            # events it is composed with here are symmetric).
            sigma, q = float(event.noise_multiplier) / 2, float(event.sampling_rate)
            return lambda count: subsampled_gaussian_pld(
                sigma, q, h, NeighboringRelation.ADD_OR_REMOVE_ONE
            ).self_compose(count)
        return None


class RdpAccountant(rdp_privacy_accountant.RdpAccountant):
    """dp-accounting's RDP accountant that also composes pure `EpsilonDeltaDpEvent` and
    `FixedSizeSampledGaussianDpEvent`.

    A pure epsilon-DP event has RDP min(epsilon, alpha epsilon^2 / 2) at order alpha (pure
    DP bounds every Renyi divergence by epsilon; Bun & Steinke 2016, Prop. 3.3, give the
    zCDP term). When every composed event is pure, `get_epsilon` also takes basic
    composition (the sum of the epsilons, delta = 0) if that is smaller.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pure_sum = 0.0
        self._only_pure = True

    def _maybe_compose(self, event, count, do_compose):
        if isinstance(event, EpsilonDeltaDpEvent):
            if event.delta > 0:
                return self.CompositionErrorDetails(
                    invalid_event=event,
                    error_message="RDP cannot compose (epsilon, delta>0) events; use PLD",
                )
            if do_compose:
                eps = event.epsilon
                self._rdp += count * np.minimum(eps, self._orders * eps**2 / 2)
                self._pure_sum += count * eps
            return None
        if isinstance(event, BoundedRangeDpEvent):
            if do_compose:  # epsilon-BR is epsilon-DP and epsilon^2/8-zCDP
                eps = event.epsilon
                self._rdp += count * np.minimum(eps, self._orders * eps**2 / 8)
                self._pure_sum += count * eps
            return None
        if isinstance(event, FixedSizeSampledGaussianDpEvent):
            event = dp_event.SampledWithoutReplacementDpEvent(
                event.dataset_size,
                event.sample_size,
                dp_event.GaussianDpEvent(event.noise_multiplier / 2),
            )
        if do_compose and not isinstance(
            event, dp_event.SelfComposedDpEvent | dp_event.ComposedDpEvent | dp_event.NoOpDpEvent
        ):
            self._only_pure = False
        return super()._maybe_compose(event, count, do_compose)

    def get_epsilon(self, target_delta: float) -> float:
        eps = super().get_epsilon(target_delta)
        return min(eps, self._pure_sum) if self._only_pure else eps


def make_accountant(
    kind: AccountantKind = "pld",
    relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE,
    *,
    value_discretization_interval: float = 1e-4,
) -> dp_accounting.PrivacyAccountant:
    """Returns a fresh accountant of the given kind for the given neighbouring relation.

    `value_discretization_interval` is the PLD grid (ignored by RDP). The default is the
    one every stated guarantee uses; a coarser grid (still pessimistic, about 10x faster per
    decade) serves only noise searches whose answer is then checked on the default grid.
    """
    if kind == "pld":
        return PldAccountant(
            neighboring_relation=relation,
            value_discretization_interval=value_discretization_interval,
        )
    if kind == "rdp":
        return RdpAccountant(neighboring_relation=relation)
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind=}")


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Silences dp-accounting's RDP warnings about orders it excludes (a safe omission)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def epsilon(
    event: dp_event.DpEvent,
    delta: float,
    *,
    accountant: AccountantKind = "pld",
    relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = 1e-4,
) -> float:
    """Smallest epsilon such that `event` is (epsilon, delta)-DP under `accountant`
    (`value_discretization_interval`: the PLD grid, see `make_accountant`)."""
    check_open_delta(delta)
    acc = make_accountant(
        accountant, relation, value_discretization_interval=value_discretization_interval
    )
    if not acc.supports(event):
        raise UnsupportedEventError(f"the {accountant} accountant cannot compose this event")
    with _quiet_absl():
        acc.compose(event)
        return float(acc.get_epsilon(delta))

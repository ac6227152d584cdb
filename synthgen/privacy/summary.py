"""Running privacy summaries of a ledger scope: charges at a cost that does not grow.

A `ScopeSummary` keeps what composes by extension, so one more event costs one RDP vector
addition, one FFT convolution of at most `MAX_PLD_BINS` bins and an epsilon search: RDP at
dp-accounting's default orders, with (epsilon, delta > 0) parts added beside it by basic
composition (each is a post-processing of a four-outcome mechanism whose loss exceeds
epsilon with probability <= delta; Kairouz, Oh & Viswanath 2015); the sum of pure epsilons;
the composed PLD, whose grid doubles when it would pass `MAX_PLD_BINS` bins, every loss
rounded *up* (which can only raise delta(epsilon), so the cache never states less than the
exact recomposition); and the sums of standalone figures (``basic``). The statement is the
least valid bound for the scope's accountant. The ledger states the summary of the record's
`EventTally`, a function of the recorded events alone. See docs/guides/privacy.md ("The
ledger at service scale").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from synthgen.privacy import accountants, events
from synthgen.privacy.errors import UnsupportedEventError

BASE_INTERVAL = 1e-4  # dp-accounting's default PLD grid; coarser grids are 2^level times it
MAX_PLD_BINS = 2**17
MAX_FIRST_BINS = 2**22  # a scope's first event keeps its own grid up to this size
TAIL_MASS_TRUNCATION = 1e-15  # dp-accounting's default: truncated right tails go to infinity
RDP_ORDERS = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=float)
_EVENT_CACHE = 64


# ---- one event's PLD and RDP, computed once per process ----------------------------------


@functools.lru_cache(maxsize=_EVENT_CACHE)
def _base_pld(event_json: str, relation: str) -> pld_lib.PrivacyLossDistribution:
    acc = accountants.PldAccountant(
        neighboring_relation=events.NeighboringRelation[relation],
        value_discretization_interval=BASE_INTERVAL,
    )
    event = events.event_from_json(event_json)
    if not acc.supports(event):
        raise UnsupportedEventError(f"the PLD accountant cannot compose {type(event).__name__}")
    acc.compose(event)
    return acc._pld  # noqa: SLF001 - dp-accounting exposes no getter


@functools.lru_cache(maxsize=_EVENT_CACHE)
def event_pld(event_json: str, relation: str, level: int = 0) -> pld_lib.PrivacyLossDistribution:
    """Pessimistic PLD of one event on the grid BASE_INTERVAL * 2**level (memoised)."""
    pld = _base_pld(event_json, relation)
    return coarsen(pld, 2**level) if level else pld


@dataclasses.dataclass(frozen=True)
class _EventRdp:
    rdp: np.ndarray | None  # None: no RDP bound covers the RDP part of the event
    approx_epsilon: float  # basic-composed (epsilon, delta > 0) parts
    approx_delta: float
    pure_epsilon: float  # sum of the epsilons if the whole event is pure, else nan


@functools.lru_cache(maxsize=_EVENT_CACHE)
def event_rdp(event_json: str, relation: str) -> _EventRdp:
    """RDP curve of one event at `RDP_ORDERS`, with its (epsilon, delta > 0) parts apart."""
    parts, approx_eps, approx_delta = _split_approximate(events.event_from_json(event_json))
    acc = accountants.RdpAccountant(
        orders=list(RDP_ORDERS), neighboring_relation=events.NeighboringRelation[relation]
    )
    rdp = None
    with accountants._quiet_absl():  # noqa: SLF001 - dp-accounting warns on excluded orders
        if all(acc.supports(part) for part in parts):
            for part in parts:
                acc.compose(part)
            rdp = np.array(acc._rdp, dtype=float)  # noqa: SLF001
    pure = _pure_total(events.event_from_json(event_json))
    return _EventRdp(rdp, approx_eps, approx_delta, pure)


def _pure_total(event: dp_event.DpEvent) -> float:
    """Sum of the epsilons if `event` is made of pure parts only (basic composition), else
    nan: read from the event's structure, never from what an accountant could compose."""
    if isinstance(event, events.EpsilonDeltaDpEvent):
        return event.epsilon if event.delta == 0 else math.nan
    if isinstance(event, events.BoundedRangeDpEvent):
        return event.epsilon
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * _pure_total(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return math.fsum(_pure_total(e) for e in event.events)
    return math.nan


def _split_approximate(event: dp_event.DpEvent) -> tuple[list[dp_event.DpEvent], float, float]:
    """(RDP parts, summed epsilon, summed delta of the (epsilon, delta > 0) parts)."""
    if isinstance(event, events.EpsilonDeltaDpEvent) and event.delta > 0:
        return [], event.epsilon, event.delta
    if isinstance(event, dp_event.SelfComposedDpEvent):
        parts, eps, delta = _split_approximate(event.event)
        inner = [dp_event.SelfComposedDpEvent(p, event.count) for p in parts]
        return inner, eps * event.count, delta * event.count
    if isinstance(event, dp_event.ComposedDpEvent):
        parts, eps, delta = [], 0.0, 0.0
        for inner in event.events:
            p, e, d = _split_approximate(inner)
            parts, eps, delta = parts + p, eps + e, delta + d
        return parts, eps, delta
    return [event], 0.0, 0.0


# ---- PLD helpers ----------------------------------------------------------------------------


def _coarsen_pmf(pmf: pld_pmf.PLDPmf, factor: int) -> pld_pmf.DensePLDPmf:
    dense = pmf.to_dense_pmf()
    if not dense._pessimistic_estimate:  # noqa: SLF001
        raise ValueError("only pessimistic PLDs may be coarsened by rounding up")
    index = dense._lower_loss + np.arange(dense.size)  # noqa: SLF001
    new_index = -((-index) // factor)  # ceil: every loss rounded up, never down
    lower = int(new_index[0])
    probs = np.bincount(new_index - lower, weights=dense._probs)  # noqa: SLF001
    return pld_pmf.DensePLDPmf(
        dense._discretization * factor,
        lower,
        probs,
        dense._infinity_mass,
        True,  # noqa: SLF001
    )


def coarsen(pld: pld_lib.PrivacyLossDistribution, factor: int) -> pld_lib.PrivacyLossDistribution:
    """`pld` on a grid `factor` times coarser, every loss rounded up (dominates `pld`)."""
    if factor == 1:
        return pld
    remove = _coarsen_pmf(pld._pmf_remove, factor)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return pld_lib.PrivacyLossDistribution(remove)
    return pld_lib.PrivacyLossDistribution(remove, _coarsen_pmf(pld._pmf_add, factor))  # noqa: SLF001


def _pmf_epsilon(pmf: pld_pmf.PLDPmf, delta: float) -> float:
    """Smallest epsilon >= 0 with hockey-stick divergence <= delta; vectorised.

    delta(eps) = m_inf + sum_{l > eps} p_l (1 - e^(eps - l)); on [l_(k-1), l_k) the sum runs
    over losses >= l_k, so delta(eps) = U_k - e^eps L_k there (U, L: suffix sums).
    """
    dense = pmf.to_dense_pmf()
    inf_mass = dense._infinity_mass  # noqa: SLF001
    if inf_mass > delta:
        return math.inf
    losses = (dense._lower_loss + np.arange(dense.size)) * dense._discretization  # noqa: SLF001
    keep = losses > 0
    losses = losses[keep]
    probs = np.maximum(dense._probs[keep], 0.0)  # noqa: SLF001 - FFT leaves -1e-20s
    if not len(losses):
        return 0.0
    upper = inf_mass + np.cumsum(probs[::-1])[::-1]  # U_k
    with np.errstate(divide="ignore"):  # log-space: losses reach the thousands
        log_lower = np.logaddexp.accumulate((np.log(probs) - losses)[::-1])[::-1]  # log L_k
    # delta at eps = l_k: U_(k+1) - e^(l_k) L_(k+1), with e^(l_k) L_(k+1) <= U_(k+1)
    upper_next = np.append(upper[1:], inf_mass)
    log_lower_next = np.append(log_lower[1:], -np.inf)
    at_grid = upper_next - np.exp(losses + log_lower_next)
    k = int(np.flatnonzero(at_grid <= delta)[0])  # at the largest loss: inf_mass <= delta
    previous = 0.0 if k == 0 else float(losses[k - 1])
    if upper[k] - np.exp(previous + log_lower[k]) <= delta:
        return previous
    eps = math.log(upper[k] - delta) - float(log_lower[k])
    return float(min(max(eps, previous), losses[k]))


def pld_epsilon(pld: pld_lib.PrivacyLossDistribution, delta: float) -> float:
    """Epsilon of `pld` at `delta`: the worse of its two directions."""
    eps = _pmf_epsilon(pld._pmf_remove, delta)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return eps
    return max(eps, _pmf_epsilon(pld._pmf_add, delta))  # noqa: SLF001


def _size(pld: pld_lib.PrivacyLossDistribution) -> int:
    return max(pld._pmf_remove.size, pld._pmf_add.size)  # noqa: SLF001


def _fit(
    pld: pld_lib.PrivacyLossDistribution, level: int
) -> tuple[pld_lib.PrivacyLossDistribution, int]:
    """Coarsens `pld` (at `level`) until it has at most MAX_PLD_BINS bins."""
    size = _size(pld)
    factor = 1
    while size > MAX_PLD_BINS * factor:
        factor *= 2
    return coarsen(pld, factor), level + int(math.log2(factor))


# ---- the summary ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScopeSummary:
    """What a scope has composed so far, kept so that one more event costs O(1).

    Attributes:
      accountant: the scope's accountant ("pld", "rdp" or "basic").
      relation: the scope's neighbouring relation (events are already converted to it).
      num_events: recorded events folded in.
      last_id: id of the last recorded charge folded in (0: none).
      rdp: summed RDP curve at RDP_ORDERS (None: an event no RDP bound covers).
      approx_epsilon, approx_delta: basic-composed (epsilon, delta > 0) parts.
      pure_epsilon: sum of epsilons while every event is pure (nan otherwise).
      pld: composed PLD (``pld`` scopes), on the grid BASE_INTERVAL * 2**pld_level.
      pld_level: the PLD grid's level.
      basic_epsilon, basic_delta: sums of the standalone figures.
    """

    accountant: str
    relation: str
    num_events: int = 0
    last_id: int = 0
    rdp: np.ndarray | None = dataclasses.field(default_factory=lambda: np.zeros(len(RDP_ORDERS)))
    approx_epsilon: float = 0.0
    approx_delta: float = 0.0
    pure_epsilon: float = 0.0
    pld: pld_lib.PrivacyLossDistribution | None = None
    pld_level: int = 0
    basic_epsilon: float = 0.0
    basic_delta: float = 0.0

    def extended(
        self,
        event_json: str,
        standalone: tuple[float, float],
        *,
        count: int = 1,
        last_id: int | None = None,
    ) -> ScopeSummary:
        """This summary with `count` more copies of one event (JSON, in the scope's relation).

        Raises:
          UnsupportedEventError: the scope's accountant cannot compose the event.
        """
        changes: dict = dict(
            num_events=self.num_events + count,
            last_id=self.last_id if last_id is None else last_id,
            basic_epsilon=self.basic_epsilon + count * standalone[0],
            basic_delta=self.basic_delta + count * standalone[1],
        )
        if self.accountant == "basic":
            return dataclasses.replace(self, **changes)
        ev = event_rdp(event_json, self.relation)
        if self.accountant == "rdp" and (ev.rdp is None or ev.approx_delta > 0):
            raise UnsupportedEventError(
                "the rdp accountant cannot compose this event ((epsilon, delta > 0) parts or "
                "an event without an RDP bound); use a pld scope"
            )
        changes.update(
            rdp=None if self.rdp is None or ev.rdp is None else self.rdp + count * ev.rdp,
            approx_epsilon=self.approx_epsilon + count * ev.approx_epsilon,
            approx_delta=self.approx_delta + count * ev.approx_delta,
            pure_epsilon=self.pure_epsilon + count * ev.pure_epsilon,
        )
        if self.accountant == "pld":
            level = self.pld_level
            own = event_pld(event_json, self.relation, level)
            if count > 1:
                own = own.self_compose(count, TAIL_MASS_TRUNCATION)
            if self.pld is None and count == 1 and _size(own) <= MAX_FIRST_BINS:
                # A first event stays on dp-accounting's grid: a scope whose cap is exactly
                # one planned release's epsilon accepts that release.
                changes["pld"], changes["pld_level"] = own, level
            else:
                own, level = _fit(own, level)
                history = coarsen(self.pld, 2 ** (level - self.pld_level)) if self.pld else None
                composed = own if history is None else history.compose(own, TAIL_MASS_TRUNCATION)
                changes["pld"], changes["pld_level"] = _fit(composed, level)
        return dataclasses.replace(self, **changes)

    def epsilon(self, delta: float) -> float:
        """The least valid epsilon of everything folded in, at `delta` (pld/rdp scopes)."""
        if self.num_events == 0:
            return 0.0
        bounds = [self.pure_epsilon] if math.isfinite(self.pure_epsilon) else []
        if self.rdp is not None and self.approx_delta < delta:
            with accountants._quiet_absl():  # noqa: SLF001
                rdp_eps, _ = rdp_lib.compute_epsilon(
                    RDP_ORDERS, self.rdp, delta - self.approx_delta
                )
            bounds.append(rdp_eps + self.approx_epsilon)
        if self.pld is not None and self.num_events == 1 and self.pld_level == 0:
            bounds.append(self.pld.get_epsilon_for_delta(delta))  # what a plan computed
        elif self.pld is not None:
            bounds.append(pld_epsilon(self.pld, delta))
        eps = min(bounds, default=math.inf)
        return eps if not math.isnan(eps) else math.inf

    def spend(self, delta_cap: float) -> tuple[float, float]:
        """(epsilon, delta) the scope states: sums under ``basic``, (epsilon at cap, cap) else."""
        if self.accountant == "basic":
            return self.basic_epsilon, self.basic_delta
        return self.epsilon(delta_cap), delta_cap


@dataclasses.dataclass(frozen=True)
class EventTally:
    """A scope's recorded events as a multiset: what its stated summary is built from.

    Distinct event JSONs in order of first record, with their counts and first standalone
    figures, and the row-by-row sums of the standalone figures. Extending a tally by new
    rows (in id order) gives the tally of the whole record, so its summary is a function
    of the recorded events alone, whatever the process saw before: the ledger's stated
    spend (`PrivacyLedger.spent`).

    Attributes:
      counts: event JSON -> how many rows recorded it (insertion order: first record).
      standalone: event JSON -> the standalone figures of its first row.
      basic_epsilon, basic_delta: row-by-row sums of the standalone figures.
      num_events: rows folded in.
      last_id: id of the last row folded in (0: none).
    """

    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    standalone: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    basic_epsilon: float = 0.0
    basic_delta: float = 0.0
    num_events: int = 0
    last_id: int = 0

    def added(
        self, records: Iterable[tuple[str, tuple[float, float]]], *, last_id: int | None = None
    ) -> EventTally:
        """This tally with `records` (event JSON, standalone figures) folded in, in order."""
        counts, standalone = dict(self.counts), dict(self.standalone)
        basic = [self.basic_epsilon, self.basic_delta]
        num = self.num_events
        for event_json, figures in records:
            counts[event_json] = counts.get(event_json, 0) + 1
            standalone.setdefault(event_json, figures)
            basic[0] += figures[0]
            basic[1] += figures[1]
            num += 1
        return EventTally(
            counts,
            standalone,
            basic[0],
            basic[1],
            num,
            self.last_id if last_id is None else last_id,
        )

    def summary(self, accountant: str, relation: str) -> ScopeSummary:
        """The summary of the tallied events: each distinct event self-composed its count
        of times, in order of first record.

        Raises:
          UnsupportedEventError: the accountant cannot compose an event.
        """
        summary = ScopeSummary(accountant, relation)
        for event_json, count in self.counts.items():
            summary = summary.extended(event_json, self.standalone[event_json], count=count)
        # Standalone figures of identical events can differ (stated at other deltas): the
        # basic sums are taken row by row.
        return dataclasses.replace(
            summary,
            last_id=self.last_id,
            basic_epsilon=self.basic_epsilon,
            basic_delta=self.basic_delta,
        )

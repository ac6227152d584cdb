"""Privacy accounting on dp-accounting: events, accountants, DP-SGD, calibration.

Every DP release in the project is described by a `dp_accounting.DpEvent` together with the
neighbouring relation under which it is analysed; this module builds those events for the
mechanisms in `mechanisms.py` and for DP-SGD, validates them, converts them between
relations where that is sound, serialises them to JSON (for the ledger and output
metadata), and turns a composition of events into one (epsilon, delta) statement with the
PLD accountant (default, tight) or the RDP accountant.

Samplings of DP-SGD (the training loop must do exactly this):
  * ``poisson``: each example joins each step's batch independently with probability
    q = batch_size / num_examples; add/remove-one neighbours; `PoissonSampledDpEvent`.
  * ``shuffle``: each step's batch is a uniformly random subset of exactly `batch_size`
    examples, drawn without replacement and independently across steps; replace-one
    neighbours; `FixedSizeSampledGaussianDpEvent`. Replacing one example changes the
    clipped batch sum by up to 2C when the example is in the batch (probability q), so a
    step is a subsampled Gaussian at sensitivity 2C: the pair N(0, s^2) vs
    (1-q) N(0, s^2) + q N(2, s^2) in units of C, taken in both orders (Balle, Barthe &
    Gaboardi 2018, Thm 10; Zhu, Dong & Wang 2022, Prop. 30). PLD composes exactly that
    pair (dp-accounting's add/remove subsampled Gaussian with multiplier sigma/2); RDP
    uses dp-accounting's without-replacement bound (Wang, Balle & Kasiviswanathan 2019)
    with multiplier sigma/2, because its multiplier is relative to the replace-one
    sensitivity 2C. (The symmetric pair (1-q)N(0)+qN(-1) vs (1-q)N(0)+qN(1), which
    describes Poisson sampling under substitution, does NOT bound fixed-size batches:
    there an example's inclusion displaces another one; it under-states epsilon 2-5x.)

  Epoch-wise shuffling (a permutation split into batches) is *not* covered by either
  accountant (Chua et al. 2024, "How private are DP-SGD implementations?").

Neighbouring relations: an event analysed under add/remove-one converts soundly to
replace-one (a replacement is a removal then an addition: group privacy of size 2, or the
doubled sensitivity of an additive mechanism); the converse does not hold, and
`convert_relation` refuses it with `RelationMismatchError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from synthgen.privacy.errors import RelationMismatchError, UnsupportedEventError

AccountantKind = Literal["pld", "rdp"]
Sampling = Literal["poisson", "shuffle"]
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
SAMPLINGS: tuple[str, ...] = ("poisson", "shuffle")
NeighboringRelation = dp_accounting.NeighboringRelation
MIN_NOISE_MULTIPLIER = 0.3


@attr.define(frozen=True)
class EpsilonDeltaDpEvent(dp_event.DpEvent):
    """A generic (epsilon, delta)-DP mechanism (delta = 0 for pure DP).

    PLD composes it through its tight dominating pair (Kairouz, Oh & Viswanath 2015);
    RDP only for delta = 0, through epsilon-DP => epsilon^2/2-zCDP (Bun & Steinke 2016).
    """

    epsilon: float
    delta: float

    def __attrs_post_init__(self) -> None:
        _check_epsilon_delta(self.epsilon, self.delta)


def _check_epsilon_delta(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon=}")
    if not (isinstance(delta, int | float) and 0 <= delta < 1):
        raise ValueError(f"delta must be in [0, 1), got {delta=}")


@attr.define(frozen=True)
class FixedSizeSampledGaussianDpEvent(dp_event.DpEvent):
    """One DP-SGD step on a batch of exactly `sample_size` of `dataset_size` examples.

    The batch is drawn uniformly without replacement; the clipped per-example gradients
    (norm <= C) are summed and N(0, (noise_multiplier * C)^2) noise is added. Analysed
    under replace-one only: replacing one example moves the sum by up to 2C when it is in
    the batch, so a step is the subsampled Gaussian pair at sensitivity 2C, i.e. multiplier
    noise_multiplier / 2 at unit sensitivity (see the module docstring for references).

    Both sizes must be integers (Python or numpy; stored as Python ints); floats, even
    integral ones, and bools are refused (see `_check_dpsgd_shape`).
    """

    dataset_size: int
    sample_size: int
    noise_multiplier: float

    def __attrs_post_init__(self) -> None:
        _check_dpsgd_shape(self.dataset_size, self.sample_size, ("dataset_size", "sample_size"))
        object.__setattr__(self, "dataset_size", int(self.dataset_size))
        object.__setattr__(self, "sample_size", int(self.sample_size))
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier=}")

    @property
    def sampling_rate(self) -> float:
        return self.sample_size / self.dataset_size


@attr.define(frozen=True)
class BoundedRangeDpEvent(dp_event.DpEvent):
    """An epsilon-bounded-range (BR) mechanism: for neighbours, the privacy losses of any
    two outcomes differ by at most epsilon; e.g. the exponential mechanism sampling
    proportionally to exp(epsilon u / (2 sensitivity)) (Durfee & Rogers 2019).

    It is epsilon-DP, and tighter: PLD composes the pair whose profile is the supremum over
    every epsilon-BR pair (`bounded_range_pld`), which covers adaptive choices (Dong, Roth
    & Su 2022, Thm 3.2; Dong, Durfee & Rogers 2020 show that adaptivity costs); RDP uses
    min(epsilon, alpha epsilon^2 / 8) (epsilon-BR => epsilon^2/8-zCDP, Cesar & Rogers 2021).
    """

    epsilon: float

    def __attrs_post_init__(self) -> None:
        _check_epsilon_delta(self.epsilon, 0.0)


def bounded_range_pld(
    epsilon: float, value_discretization_interval: float = 1e-4
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """Pessimistic PLD of the pair dominating every epsilon-BR pair, in both directions.

    Its profile is sup_t delta_{RR_t}(e) = (1 - e^(-(eps - e)/2))^2 / (1 - e^-eps) on
    [0, eps] (at t = (eps + e)/2), where RR_t is the binary pair with losses t and t - eps:
    P(L > s) = (1 - u)/(1 - e^-eps), u = e^((|s| - eps)/2), for s >= 0, and
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


class PldAccountant(pld_privacy_accountant.PLDAccountant):
    """dp-accounting's PLD accountant that also composes `EpsilonDeltaDpEvent`,
    `BoundedRangeDpEvent` and `FixedSizeSampledGaussianDpEvent`."""

    def _maybe_compose(self, event, count, do_compose):
        if isinstance(event, BoundedRangeDpEvent):
            if do_compose:
                pld = bounded_range_pld(event.epsilon, self._value_discretization_interval)
                self._pld = self._pld.compose(pld.self_compose(count))
            return None
        if isinstance(event, EpsilonDeltaDpEvent):
            if do_compose:
                params = privacy_loss_distribution.common.DifferentialPrivacyParameters(
                    epsilon=event.epsilon, delta=event.delta
                )
                pld = privacy_loss_distribution.from_privacy_parameters(
                    params, value_discretization_interval=self._value_discretization_interval
                )
                self._pld = self._pld.compose(pld.self_compose(count))
            return None
        replace_one = self.neighboring_relation == NeighboringRelation.REPLACE_ONE
        if replace_one and isinstance(event, dp_event.GaussianDpEvent | dp_event.LaplaceDpEvent):
            # The multiplier is relative to the replace-one sensitivity, as in the RDP
            # accountant (dp-accounting's PLD would compare N(-1) with N(+1), doubling it),
            # so one event means the same under both accountants.
            if do_compose:
                if isinstance(event, dp_event.GaussianDpEvent):
                    pld = privacy_loss_distribution.from_gaussian_mechanism(
                        standard_deviation=event.noise_multiplier / math.sqrt(count),
                        value_discretization_interval=self._value_discretization_interval,
                    )
                else:
                    pld = privacy_loss_distribution.from_laplace_mechanism(
                        event.noise_multiplier,
                        value_discretization_interval=self._value_discretization_interval,
                    ).self_compose(count)
                self._pld = self._pld.compose(pld)
            return None
        if isinstance(event, FixedSizeSampledGaussianDpEvent):
            if not replace_one:
                return self.CompositionErrorDetails(
                    invalid_event=event,
                    error_message="fixed-size batches are analysed under REPLACE_ONE only",
                )
            if do_compose:
                # Both orders of N(0, s^2) vs (1-q) N(0, s^2) + q N(2, s^2): dp-accounting's
                # add/remove pair of the subsampled Gaussian with multiplier sigma / 2. Each
                # order is composed with itself and the worse total is stated; with adaptive
                # steps the worse order may change from step to step, which the
                # per-direction composition is taken to cover (checked numerically on mixed
                # orders; the events it is composed with here are symmetric).
                pld = privacy_loss_distribution.from_gaussian_mechanism(
                    standard_deviation=event.noise_multiplier / 2,
                    sampling_prob=event.sampling_rate,
                    value_discretization_interval=self._value_discretization_interval,
                    neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                )
                self._pld = self._pld.compose(pld.self_compose(count))
            return None
        return super()._maybe_compose(event, count, do_compose)


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
) -> dp_accounting.PrivacyAccountant:
    """Returns a fresh accountant of the given kind for the given neighbouring relation."""
    if kind == "pld":
        return PldAccountant(neighboring_relation=relation)
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


# ---- events of the mechanisms -------------------------------------------------------------


def gaussian_event(noise_multiplier: float) -> dp_event.DpEvent:
    """Gaussian mechanism with noise std = noise_multiplier * L2 sensitivity."""
    _check_positive("noise_multiplier", noise_multiplier)
    return dp_event.GaussianDpEvent(float(noise_multiplier))


def laplace_event(epsilon: float) -> dp_event.DpEvent:
    """Laplace mechanism with scale = sensitivity / epsilon."""
    _check_positive("epsilon", epsilon)
    return dp_event.LaplaceDpEvent(1.0 / epsilon)


def pure_epsilon_event(epsilon: float) -> dp_event.DpEvent:
    """Any epsilon-DP mechanism (exponential, report-noisy-max, sparse vector)."""
    return EpsilonDeltaDpEvent(epsilon=float(epsilon), delta=0.0)


def bounded_range_event(epsilon: float) -> dp_event.DpEvent:
    """An epsilon-bounded-range mechanism (the exponential mechanism's tighter analysis)."""
    return BoundedRangeDpEvent(epsilon=float(epsilon))


def epsilon_delta_event(epsilon: float, delta: float) -> dp_event.DpEvent:
    """Any (epsilon, delta)-DP mechanism (e.g. LimitedDomain top-1)."""
    return EpsilonDeltaDpEvent(epsilon=float(epsilon), delta=float(delta))


def poisson_sampled(sampling_rate: float, event: dp_event.DpEvent) -> dp_event.DpEvent:
    """`event` run on a Poisson subsample with inclusion probability `sampling_rate`."""
    _check_rate(sampling_rate)
    return dp_event.PoissonSampledDpEvent(float(sampling_rate), event)


def self_composed(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
    """`event` run `count` times."""
    _check_count(count)
    return dp_event.SelfComposedDpEvent(event, int(count))


def compose(events: Sequence[dp_event.DpEvent]) -> dp_event.DpEvent:
    """All `events` run on the same dataset; identical events are grouped by count."""
    counts = Counter(event_to_json(e) for e in events)
    grouped = [
        event_from_json(s) if n == 1 else self_composed(event_from_json(s), n)
        for s, n in counts.items()
    ]
    return grouped[0] if len(grouped) == 1 else dp_event.ComposedDpEvent(grouped)


# ---- validation and neighbouring relations -----------------------------------------------


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {name}={value!r}")


def _check_rate(sampling_rate: float) -> None:
    if not (isinstance(sampling_rate, int | float) and 0 < sampling_rate <= 1):
        raise ValueError(f"sampling rate must be in (0, 1], got {sampling_rate=}")


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count=}")


def check_delta(delta: float, num_examples: int) -> None:
    """Refuses a delta outside (0, 1/n): a larger delta permits releasing one example.

    Raises:
      ValueError: naming the bound, not the data.
    """
    if not (isinstance(delta, int | float) and 0 < delta < 1.0 / num_examples):
        raise ValueError(
            f"delta must be in (0, 1/n) = (0, {1 / num_examples:.3g}) for n={num_examples}, "
            f"got {delta=}"
        )


def validate_event(event: dp_event.DpEvent) -> None:
    """Checks every parameter of `event` (recursively) before it may reach a ledger.

    epsilon >= 0 and finite, 0 <= delta < 1, sigma > 0 and finite, 0 < q <= 1, counts >= 1;
    a non-private event and event types the project does not produce are refused, among
    them dp-accounting's `SampledWithoutReplacementDpEvent`, whose multiplier is relative to
    the replace-one sensitivity 2C and so under-states DP-SGD with fixed-size batches when
    given sigma (use `FixedSizeSampledGaussianDpEvent`).

    Raises:
      ValueError: a parameter is out of range.
      UnsupportedEventError: the event type is not one the ledger accepts.
    """
    if isinstance(event, EpsilonDeltaDpEvent):
        _check_epsilon_delta(event.epsilon, event.delta)
    elif isinstance(event, BoundedRangeDpEvent):
        _check_epsilon_delta(event.epsilon, 0.0)
    elif isinstance(event, FixedSizeSampledGaussianDpEvent):
        event.__attrs_post_init__()
    elif isinstance(event, dp_event.GaussianDpEvent | dp_event.LaplaceDpEvent):
        _check_positive("noise_multiplier", event.noise_multiplier)
    elif isinstance(event, dp_event.PoissonSampledDpEvent):
        _check_rate(event.sampling_probability)
        validate_event(event.event)
    elif isinstance(event, dp_event.SelfComposedDpEvent):
        _check_count(event.count)
        validate_event(event.event)
    elif isinstance(event, dp_event.ComposedDpEvent):
        if not event.events:
            raise ValueError("a composed event needs at least one event")
        for inner in event.events:
            validate_event(inner)
    elif isinstance(event, dp_event.ZCDpEvent):
        if not (math.isfinite(event.rho) and event.rho >= 0 and event.xi >= 0):
            raise ValueError(f"zCDP parameters must be finite and >= 0, got {event=}")
    else:
        raise UnsupportedEventError(f"the ledger does not accept {type(event).__name__}")


def as_relation(relation: NeighboringRelation | str) -> NeighboringRelation:
    """The relation named by `relation` (an enum member or its name); ValueError otherwise."""
    if isinstance(relation, NeighboringRelation):
        return relation
    try:
        return NeighboringRelation[relation]
    except KeyError:
        names = list(NeighboringRelation.__members__)
        raise ValueError(f"relation must be one of {names}, got {relation=}") from None


def convert_relation(
    event: dp_event.DpEvent,
    source: NeighboringRelation | str,
    target: NeighboringRelation | str,
) -> dp_event.DpEvent:
    """An event that, analysed under `target`, bounds `event` analysed under `source`.

    Add/remove-one to replace-one is sound (a replacement is a removal then an addition):
      * Gaussian / Laplace noise: the replace-one sensitivity of any statistic is at most
        twice its add/remove sensitivity, so the multiplier (noise / sensitivity) halves
        (both accountants here read a replace-one multiplier relative to the replace-one
        sensitivity; the RDP accountant cannot compose Poisson-sampled events under
        replace-one and refuses them);
      * (epsilon, delta)-DP: group privacy of size 2 gives (2 epsilon, (1 + e^epsilon) delta)
        (Dwork & Roth 2014, Thm 2.2 and its approximate-DP form);
      * a Poisson-subsampled Gaussian: dp-accounting's replace-one pair of Poisson sampling,
        (1-q) N(0) + q N(-1) vs (1-q) N(0) + q N(1), is exactly this sampling under
        substitution (the removed and the added example each join with probability q);
      * composed events convert part by part.

    Anything else, and any conversion from replace-one to add/remove (which does not hold
    in general: a replace-one guarantee says nothing about datasets of other sizes), raises.

    Raises:
      RelationMismatchError: no sound conversion is known.
    """
    source, target = as_relation(source), as_relation(target)
    if source == target:
        return event
    if not (
        source == NeighboringRelation.ADD_OR_REMOVE_ONE
        and target == NeighboringRelation.REPLACE_ONE
    ):
        raise RelationMismatchError(
            f"an event analysed under {source.name} cannot be charged to a {target.name} "
            "scope: no sound conversion exists"
        )
    return _to_replace_one(event)


def restate_legacy(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """An event recorded by an earlier version, restated so that it is never under-counted.

    Earlier versions recorded fixed-size DP-SGD for RDP as dp-accounting's
    `SampledWithoutReplacementDpEvent` with multiplier sigma (relative to C, where that
    event expects the replace-one sensitivity 2C); it becomes the fixed-size event, which is
    never smaller. Other events are returned unchanged.
    """
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent) and isinstance(
        event.event, dp_event.GaussianDpEvent
    ):
        return FixedSizeSampledGaussianDpEvent(
            event.source_dataset_size, event.sample_size, event.event.noise_multiplier
        )
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(restate_legacy(event.event), event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([restate_legacy(e) for e in event.events])
    return event


def _to_replace_one(event: dp_event.DpEvent) -> dp_event.DpEvent:
    if isinstance(event, EpsilonDeltaDpEvent):
        delta = min((1 + math.exp(event.epsilon)) * event.delta, 1.0)
        if delta >= 1:
            raise RelationMismatchError("group privacy of this (epsilon, delta) event is vacuous")
        return EpsilonDeltaDpEvent(2 * event.epsilon, delta)
    if isinstance(event, BoundedRangeDpEvent):  # the two losses' ranges add up
        return BoundedRangeDpEvent(2 * event.epsilon)
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_event.LaplaceDpEvent):
        return dp_event.LaplaceDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(
        event.event, dp_event.GaussianDpEvent
    ):
        return event
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(_to_replace_one(event.event), event.count)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([_to_replace_one(e) for e in event.events])
    raise RelationMismatchError(
        f"no sound ADD_OR_REMOVE_ONE -> REPLACE_ONE conversion for {type(event).__name__}"
    )


# ---- DP-SGD -------------------------------------------------------------------------------


def neighboring_relation(sampling: Sampling) -> NeighboringRelation:
    """The neighbouring relation under which a DP-SGD sampling is analysed."""
    if sampling == "poisson":
        return NeighboringRelation.ADD_OR_REMOVE_ONE
    if sampling == "shuffle":
        return NeighboringRelation.REPLACE_ONE
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling=}")


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    """Number of steps that visit `epochs` x `num_examples` examples in expectation."""
    _check_dpsgd_shape(num_examples, batch_size)
    if not epochs > 0:
        raise ValueError(f"epochs must be positive, got {epochs=}")
    return max(1, math.ceil(epochs * num_examples / batch_size))


def _check_dpsgd_shape(
    num_examples: int, batch_size: int, names: tuple[str, str] = ("num_examples", "batch_size")
) -> None:
    """Refuses a DP-SGD shape the accountants would misread: sizes are counts.

    Both must be integers (int or numpy integer) with 1 <= batch_size <= num_examples. The
    strict choice: a float is refused even when integral (2.0), and so is a bool, because
    a float size means a computation upstream went wrong (a dataset of 2.5 examples once
    reached the accountant), and the accountant must not guess what was meant.
    """
    for name, value in zip(names, (num_examples, batch_size), strict=True):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name} must be an integer, got {name}={value!r}")
    if num_examples < 1:
        raise ValueError(f"{names[0]} must be >= 1, got {names[0]}={num_examples!r}")
    if not 1 <= batch_size <= num_examples:
        raise ValueError(f"{names[1]} must be in [1, {names[0]}], got {names[1]}={batch_size!r}")


def dpsgd_event(
    *,
    noise_multiplier: float,
    num_examples: int,
    batch_size: int,
    steps: int,
    sampling: Sampling = "poisson",
    accountant: AccountantKind = "pld",
) -> dp_event.DpEvent:
    """The DpEvent of `steps` DP-SGD steps (see the module docstring for the samplings).

    `batch_size` is the expected batch size (Poisson) or the exact one (shuffle). Both
    accountants take the same event; `accountant` is validated for the caller's sake.
    """
    _check_dpsgd_shape(num_examples, batch_size)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps=}")
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant=}")
    if sampling == "poisson":
        sampled = poisson_sampled(batch_size / num_examples, gaussian_event(noise_multiplier))
    elif sampling == "shuffle":
        sampled = FixedSizeSampledGaussianDpEvent(num_examples, batch_size, noise_multiplier)
    else:
        raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling=}")
    return self_composed(sampled, steps)


def epsilon(
    event: dp_event.DpEvent,
    delta: float,
    *,
    accountant: AccountantKind = "pld",
    relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE,
) -> float:
    """Smallest epsilon such that `event` is (epsilon, delta)-DP under `accountant`."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    acc = make_accountant(accountant, relation)
    if not acc.supports(event):
        raise UnsupportedEventError(f"the {accountant} accountant cannot compose this event")
    with _quiet_absl():
        acc.compose(event)
        return float(acc.get_epsilon(delta))


def dpsgd_epsilon(
    *,
    noise_multiplier: float,
    num_examples: int,
    batch_size: int,
    steps: int,
    delta: float,
    sampling: Sampling = "poisson",
    accountant: AccountantKind = "pld",
) -> float:
    """Epsilon of DP-SGD with the given parameters."""
    event = dpsgd_event(
        noise_multiplier=noise_multiplier,
        num_examples=num_examples,
        batch_size=batch_size,
        steps=steps,
        sampling=sampling,
        accountant=accountant,
    )
    return epsilon(event, delta, accountant=accountant, relation=neighboring_relation(sampling))


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    num_examples: int,
    batch_size: int,
    steps: int,
    sampling: Sampling = "poisson",
    accountant: AccountantKind = "pld",
    tolerance: float = 1e-3,
) -> float:
    """Smallest sigma (within `tolerance`) making the DP-SGD run (target_epsilon, delta)-DP.

    Raises:
      ValueError: on a non-positive target or a delta outside (0, 1).
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be positive, got {target_epsilon=}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    relation = neighboring_relation(sampling)

    def make_event(sigma: float) -> dp_event.DpEvent:
        return dpsgd_event(
            noise_multiplier=sigma,
            num_examples=num_examples,
            batch_size=batch_size,
            steps=steps,
            sampling=sampling,
            accountant=accountant,
        )

    def eps_of(sigma: float) -> float:
        acc = make_accountant(accountant, relation)
        with _quiet_absl():
            return float(acc.compose(make_event(sigma)).get_epsilon(delta))

    # Bracket [lower, upper] with eps(lower) > target >= eps(upper). Very small sigmas make
    # the PLD discretisation explode, so the search stops at MIN_NOISE_MULTIPLIER: a target
    # reachable with less noise gets that floor (more noise than needed, never less).
    if eps_of(MIN_NOISE_MULTIPLIER) <= target_epsilon:
        return MIN_NOISE_MULTIPLIER
    lower, upper = MIN_NOISE_MULTIPLIER, 1.0
    while eps_of(upper) > target_epsilon:
        lower, upper = upper, upper * 2
        if upper > 1e4:
            raise ValueError(f"no noise multiplier <= 1e4 reaches {target_epsilon=}")
    with _quiet_absl():
        sigma = dp_accounting.calibrate_dp_mechanism(
            lambda: make_accountant(accountant, relation),
            make_event,
            target_epsilon,
            delta,
            dp_accounting.ExplicitBracketInterval(lower, upper),
            tol=tolerance,
        )
    # Brent's method returns a point within tol of the optimum; step up to the safe side.
    while eps_of(sigma) > target_epsilon:
        sigma += tolerance
    return float(sigma)


# ---- JSON ---------------------------------------------------------------------------------

_EVENT_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in vars(dp_event).values()
    if isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)
}
_EVENT_TYPES[EpsilonDeltaDpEvent.__name__] = EpsilonDeltaDpEvent
_EVENT_TYPES[FixedSizeSampledGaussianDpEvent.__name__] = FixedSizeSampledGaussianDpEvent
_EVENT_TYPES[BoundedRangeDpEvent.__name__] = BoundedRangeDpEvent


def _to_plain(event: dp_event.DpEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_event.DpEvent):
            value = _to_plain(value)
        elif isinstance(value, list | tuple) and value and isinstance(value[0], dp_event.DpEvent):
            value = [_to_plain(v) for v in value]
        out[field.name] = value
    return out


def _from_plain(data: dict[str, Any]) -> dp_event.DpEvent:
    data = dict(data)
    cls = _EVENT_TYPES.get(data.pop("type", None))
    if cls is None:
        raise ValueError("unknown DpEvent type in JSON")
    kwargs = {}
    for key, value in data.items():
        if isinstance(value, dict) and "type" in value:
            value = _from_plain(value)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            value = [_from_plain(v) for v in value]
        kwargs[key] = value
    return cls(**kwargs)


def event_to_json(event: dp_event.DpEvent) -> str:
    """Canonical JSON of a DpEvent (sorted keys), for the ledger and metadata."""
    return json.dumps(_to_plain(event), sort_keys=True)


def event_from_json(text: str) -> dp_event.DpEvent:
    """Inverse of `event_to_json`."""
    return _from_plain(json.loads(text))


# ---- DP few-shot generation (Tang et al. 2024) ----------------------------------------------

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
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")
    mechanism = event_args.get("mechanism", "gaussian")
    name = "noise_multiplier" if mechanism == "gaussian" else "token_epsilon"

    increasing = name == "token_epsilon"

    def eps_of(value: float, interval: float = 1e-4 if increasing else 1e-3) -> float:
        # Gaussian: a coarse PLD grid for the search (10x faster), the default for the answer.
        acc = PldAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE, interval)
        with _quiet_absl():
            acc.compose(fewshot_event(**event_args, **{name: value}))
            return float(acc.get_epsilon(delta))

    # Bisection in log space on a monotone function: epsilon falls with sigma and rises
    # with the per-token epsilon.
    lo, hi = (1e-6, 1.0) if increasing else (MIN_NOISE_MULTIPLIER, 1.0)
    floor_enough = not increasing and eps_of(lo) <= target_epsilon
    while not floor_enough and (eps_of(hi) <= target_epsilon) == increasing:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"no {name} in range reaches {target_epsilon=}")
    if increasing and eps_of(lo) > target_epsilon:
        raise ValueError(f"{target_epsilon=} is below what any per-token epsilon >= 1e-6 gives")
    while not floor_enough and hi - lo > tolerance * lo:
        mid = math.sqrt(lo * hi)
        if (eps_of(mid) <= target_epsilon) == increasing:
            lo = mid
        else:
            hi = mid
    value = lo if increasing or floor_enough else hi
    while eps_of(value, 1e-4) > target_epsilon:  # the answer, on the safe side
        value = value / (1 + tolerance) if increasing else value * (1 + tolerance)
    return float(value)

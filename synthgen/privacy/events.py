"""Privacy events: the DpEvents of the mechanisms, their validation, relations and JSON.

Every DP release is described by a `dp_accounting.DpEvent` and the neighbouring relation
it is analysed under. Holds the event types dp-accounting lacks (`EpsilonDeltaDpEvent`,
`FixedSizeSampledGaussianDpEvent`, `BoundedRangeDpEvent`), the events of `mechanisms.py`,
their validation before a ledger (`validate_event`, `check_delta`), sound conversion between
relations (`convert_relation`: add/remove-one to replace-one only; `restate_legacy`) and
their canonical JSON (`event_to_json`, `event_from_json`). The accountants live in
`accountants.py`; DP-SGD's events in `dpsgd_accounting.py`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event

from synthgen.privacy.errors import RelationMismatchError, UnsupportedEventError

NeighboringRelation = dp_accounting.NeighboringRelation


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
    noise_multiplier / 2 at unit sensitivity (see `dpsgd_accounting` for references).

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
    """Any epsilon-DP mechanism (e.g. the exponential mechanism)."""
    return EpsilonDeltaDpEvent(epsilon=float(epsilon), delta=0.0)


def bounded_range_event(epsilon: float) -> dp_event.DpEvent:
    """An epsilon-bounded-range mechanism (the exponential mechanism's tighter analysis)."""
    return BoundedRangeDpEvent(epsilon=float(epsilon))


def epsilon_delta_event(epsilon: float, delta: float) -> dp_event.DpEvent:
    """Any (epsilon, delta)-DP mechanism (e.g. a partition selection)."""
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


def check_open_delta(delta: float) -> None:
    """Refuses a delta outside (0, 1), the range of a stated guarantee's delta."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta=}")


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

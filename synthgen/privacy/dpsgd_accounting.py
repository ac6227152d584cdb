"""DP-SGD accounting: the event, epsilon and noise calibration of a DP-SGD run.

Holds the samplings (`SAMPLINGS`) and their neighbouring relations (`neighboring_relation`),
`steps_for_epochs`, `dpsgd_event`, `dpsgd_epsilon` and `calibrate_noise_multiplier`. The
event of one fixed-size step is `events.FixedSizeSampledGaussianDpEvent`; the accountants
are those of `accountants.py`.

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
"""

from __future__ import annotations

import math
from typing import Literal

import dp_accounting
from dp_accounting import dp_event

from synthgen.privacy.accountants import (
    ACCOUNTANTS,
    MIN_NOISE_MULTIPLIER,
    AccountantKind,
    _quiet_absl,
    epsilon,
    make_accountant,
)
from synthgen.privacy.events import (
    FixedSizeSampledGaussianDpEvent,
    NeighboringRelation,
    _check_dpsgd_shape,
    gaussian_event,
    poisson_sampled,
    self_composed,
)

Sampling = Literal["poisson", "shuffle"]
SAMPLINGS: tuple[str, ...] = ("poisson", "shuffle")


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

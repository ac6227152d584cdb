"""DP-SGD accounting: the event, epsilon and noise calibration of a DP-SGD run.

Holds the samplings (`SAMPLINGS`) and their neighbouring relations (`neighboring_relation`),
`steps_for_epochs`, `dpsgd_event`, `dpsgd_epsilon` and `calibrate_noise_multiplier`, on the
accountants of `accountants.py`. See docs/guides/privacy.md ("DP-SGD samplings").

Samplings of DP-SGD (the training loop must do exactly this):
  * ``poisson``: each example joins each step's batch independently with probability
    q = batch_size / num_examples; add/remove-one neighbours; `PoissonSampledDpEvent`.
  * ``shuffle``: each step's batch is a uniformly random subset of exactly `batch_size`
    examples, independent across steps; replace-one neighbours;
    `FixedSizeSampledGaussianDpEvent`. Replacing one example moves the clipped batch sum by
    up to 2C when it is in the batch (probability q): the pair N(0, s^2) vs
    (1-q) N(0, s^2) + q N(2, s^2) in units of C, in both orders (Balle, Barthe & Gaboardi
    2018, Thm 10; Zhu, Dong & Wang 2022, Prop. 30). PLD composes that pair (multiplier
    sigma/2); RDP uses the without-replacement bound (Wang, Balle & Kasiviswanathan 2019)
    with multiplier sigma/2, relative to the replace-one sensitivity 2C. (The symmetric
    Poisson substitution pair does NOT bound fixed-size batches: it under-states epsilon
    2-5x.) Epoch-wise shuffling is covered by neither (Chua et al. 2024).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

from dp_accounting import dp_event

from synthgen.privacy import accountants, calibration, events
from synthgen.privacy.accountants import MIN_NOISE_MULTIPLIER, AccountantKind

Sampling = Literal["poisson", "shuffle"]
SAMPLINGS: tuple[str, ...] = ("poisson", "shuffle")


def neighboring_relation(sampling: Sampling) -> events.NeighboringRelation:
    """The neighbouring relation under which a DP-SGD sampling is analysed."""
    if sampling == "poisson":
        return events.NeighboringRelation.ADD_OR_REMOVE_ONE
    if sampling == "shuffle":
        return events.NeighboringRelation.REPLACE_ONE
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling=}")


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    """Number of steps that visit `epochs` x `num_examples` examples in expectation."""
    events._check_dpsgd_shape(num_examples, batch_size)
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
    events._check_dpsgd_shape(num_examples, batch_size)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps=}")
    if accountant not in accountants.ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {accountants.ACCOUNTANTS}, got {accountant=}")
    if sampling == "poisson":
        gaussian = events.gaussian_event(noise_multiplier)
        sampled = events.poisson_sampled(batch_size / num_examples, gaussian)
    elif sampling == "shuffle":
        sampled = events.FixedSizeSampledGaussianDpEvent(num_examples, batch_size, noise_multiplier)
    else:
        raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling=}")
    return events.self_composed(sampled, steps)


def dpsgd_epsilon(*, noise_multiplier: float, delta: float, **run: Any) -> float:
    """Epsilon of DP-SGD with the given parameters (memoised: a plan states it twice).

    `run`: `dpsgd_event`'s other keywords (num_examples, batch_size, steps, and optionally
    sampling and accountant, default ``poisson`` and ``pld``).
    """
    events.check_open_delta(delta)
    return _run_epsilon(float(noise_multiplier), float(delta), _Run(**run), STATED_INTERVAL)


def calibrate_noise_multiplier(
    *, target_epsilon: float, delta: float, tolerance: float = 1e-3, **run: Any
) -> float:
    """Smallest sigma (within a few times `tolerance`) making the run (target_epsilon, delta)-DP.

    `run`: as in `dpsgd_epsilon`. The search runs on a PLD grid of `SEARCH_INTERVAL`
    (pessimistic like the default grid, about 10x faster); the answer is then checked, and
    stepped up if needed, on the default grid that states the run's guarantee, so the
    returned sigma meets the target under the accountant the ledger uses. Results are
    memoised per argument tuple (a pipeline's precheck and its stage calibrate the same run).

    Raises:
      ValueError: on a non-positive target or a delta outside (0, 1).
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be positive, got {target_epsilon=}")
    events.check_open_delta(delta)
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance=}")
    run = _Run(**run)
    run.event(1.0)  # validates the shape, sampling and accountant before any search
    return _calibrate(float(target_epsilon), float(delta), run, float(tolerance))


SEARCH_INTERVAL = 1e-3  # the PLD grid of the noise search
STATED_INTERVAL = 1e-4  # the PLD grid of every stated epsilon (dp-accounting's default)


@dataclasses.dataclass(frozen=True)
class _Run:
    """The public shape of a DP-SGD run (all but sigma and delta): the memoised key.

    Its fields are `dpsgd_event`'s keywords of the same names.
    """

    num_examples: int
    batch_size: int
    steps: int
    sampling: Sampling = "poisson"
    accountant: AccountantKind = "pld"

    def event(self, noise_multiplier: float) -> dp_event.DpEvent:
        return dpsgd_event(noise_multiplier=noise_multiplier, **dataclasses.asdict(self))


@functools.lru_cache(maxsize=256)
def _run_epsilon(sigma: float, delta: float, run: _Run, interval: float) -> float:
    """Epsilon of one DP-SGD run on a PLD grid of `interval` (memoised: pure in its args)."""
    return accountants.epsilon(
        run.event(sigma),
        delta,
        accountant=run.accountant,
        relation=neighboring_relation(run.sampling),
        value_discretization_interval=interval,
    )


@functools.lru_cache(maxsize=64)
def _calibrate(target_epsilon: float, delta: float, run: _Run, tolerance: float) -> float:
    def search_eps(sigma: float) -> float:
        return _run_epsilon(float(sigma), delta, run, SEARCH_INTERVAL)

    def stated_eps(sigma: float) -> float:
        return _run_epsilon(float(sigma), delta, run, STATED_INTERVAL)

    # Bracket [lower, upper] with eps(lower) > target >= eps(upper). Very small sigmas make
    # the PLD discretisation explode, so the search stops at MIN_NOISE_MULTIPLIER: a target
    # reachable with less noise gets that floor (more noise than needed, never less).
    if search_eps(MIN_NOISE_MULTIPLIER) <= target_epsilon:
        sigma = MIN_NOISE_MULTIPLIER
    else:
        lower, upper = calibration.grow(
            lambda s: search_eps(s) > target_epsilon,
            MIN_NOISE_MULTIPLIER,
            1.0,
            limit=1e4,
            error=f"no noise multiplier <= 1e4 reaches {target_epsilon=}",
        )
        relation = neighboring_relation(run.sampling)
        with accountants._quiet_absl():
            sigma = calibration.calibrate_event(
                lambda s: run.event(float(s)),
                lambda: accountants.make_accountant(
                    run.accountant, relation, value_discretization_interval=SEARCH_INTERVAL
                ),
                target_epsilon=target_epsilon,
                delta=delta,
                lower=lower,
                upper=upper,
                tol=tolerance,
            )
    # Brent's root lies within tol of the search grid's answer: step up to its safe side
    # (cheap), then to the safe side of the stated grid (usually no step: the two grids
    # agree to about 1e-4 in epsilon, and each stated evaluation costs seconds).
    while search_eps(sigma) > target_epsilon:
        sigma += tolerance
    step = tolerance
    while stated_eps(sigma) > target_epsilon:
        sigma, step = sigma + step, step * 2
    return sigma

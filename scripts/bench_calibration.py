"""Seconds to calibrate DP-SGD's noise: a coarse-grid search vs a search on the stated grid.

`synthgen.privacy.calibrate_noise_multiplier` searches sigma on a 1e-3 PLD grid and checks
the answer on the 1e-4 grid that states every guarantee. The reference is the previous
method: dp-accounting's `calibrate_dp_mechanism` (Brent) on the 1e-4 grid, then stepping up
until the stated epsilon meets the target. Both start from the same bracket; caches are
cleared before each timed call. The last line is exactly
``calibration_speedup=<geometric mean> max_sigma_gap=<largest |new - reference| sigma>``.

    python scripts/bench_calibration.py          # a few minutes on 2 cores
"""

from __future__ import annotations

import math
import time

import dp_accounting

from synthgen.privacy import accounting
from synthgen.privacy import dpsgd_accounting as dpsgd
from synthgen.privacy.accountants import (
    MIN_NOISE_MULTIPLIER,
    make_accountant,
    subsampled_gaussian_pld,
)

# (label, shape): the tiny pipeline's generator, the demo's, a shuffled run.
CASES = [
    ("tiny pipeline (n 96, b 16, eps 8)", dict(num_examples=96, batch_size=16, steps=6), 8.0),
    ("demo-sized (n 1600, b 64, eps 3)", dict(num_examples=1600, batch_size=64, steps=75), 3.0),
    (
        "shuffle (n 1000, b 50, eps 4)",
        dict(num_examples=1000, batch_size=50, steps=40, sampling="shuffle"),
        4.0,
    ),
]
DELTA, TOL = 1e-5, 1e-3


def _clear() -> None:
    dpsgd._run_epsilon.cache_clear()  # noqa: SLF001 - a benchmark times cold calls
    dpsgd._calibrate.cache_clear()  # noqa: SLF001
    subsampled_gaussian_pld.cache_clear()


def reference(target: float, shape: dict) -> float:
    """The previous method: Brent on the stated (1e-4) grid, then step up."""
    sampling = shape.get("sampling", "poisson")
    relation = dpsgd.neighboring_relation(sampling)

    def event(sigma: float):
        return dpsgd.dpsgd_event(noise_multiplier=sigma, **shape)

    def eps(sigma: float) -> float:
        return float(make_accountant("pld", relation).compose(event(sigma)).get_epsilon(DELTA))

    if eps(MIN_NOISE_MULTIPLIER) <= target:
        return MIN_NOISE_MULTIPLIER
    lower, upper = MIN_NOISE_MULTIPLIER, 1.0
    while eps(upper) > target:
        lower, upper = upper, 2 * upper
    sigma = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant("pld", relation),
        event,
        target,
        DELTA,
        dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=TOL,
    )
    while eps(sigma) > target:
        sigma += TOL
    return float(sigma)


def main() -> None:
    ratios, gaps = [], []
    print("| run | reference s | now s | speed-up | sigma ref | sigma now | eps now |")
    print("|---|---|---|---|---|---|---|")
    for label, shape, target in CASES:
        _clear()
        start = time.perf_counter()
        ref = reference(target, shape)
        ref_s = time.perf_counter() - start
        _clear()
        start = time.perf_counter()
        now = accounting.calibrate_noise_multiplier(target_epsilon=target, delta=DELTA, **shape)
        now_s = time.perf_counter() - start
        stated = accounting.dpsgd_epsilon(noise_multiplier=now, delta=DELTA, **shape)
        assert stated <= target, (label, stated)
        ratios.append(ref_s / now_s)
        gaps.append(abs(now - ref))
        print(
            f"| {label} | {ref_s:.1f} | {now_s:.1f} | {ref_s / now_s:.1f}x | {ref:.4f} "
            f"| {now:.4f} | {stated:.4f} |"
        )
    speedup = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"calibration_speedup={speedup:.2f} max_sigma_gap={max(gaps):.4f}")


if __name__ == "__main__":
    main()

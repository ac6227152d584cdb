"""The DP nearest-neighbour histogram of Private Evolution: private samples vote, noise counts.

Every private sample votes +1 for each of its `votes` nearest candidates (public, synthetic
samples) of its own group (label) in an embedding space; the counts get Gaussian noise and
noisy counts below a public threshold become 0 (`dp_nn_histogram`).

Privacy:
  Unit: one private sample; add/remove-one neighbours. Adding a sample adds +1 to at most
  `votes` distinct candidates (its k nearest, in its group only) and changes no other
  vote, so the count vector moves by exactly sqrt(votes) in L2: the Gaussian mechanism with
  noise multiplier sigma / sqrt(votes) (Dwork & Roth 2014, Thm A.1; Balle & Wang 2018).
  Thresholding and normalising the noisy counts are post-processing. The candidates and
  the threshold are public; the private embeddings are computed by a public encoder from
  one sample each, so a sample's votes depend on that sample alone -- up to float rounding,
  as in every floating-point DP implementation: batched embedding shares numerics between
  rows (the encoder masks padding, so the difference is rounding only), and distances are
  computed in float64 in blocks of one fixed shape whatever the number of rows.

References:
  Lin, Gopi, Kulkarni, Nori, Yekhanin 2024, "Differentially Private Synthetic Data via
  Foundation Model APIs 1: Images" (ICLR 2024), Algorithm 2 (DP_NN_HISTOGRAM);
  Xie, Lin, Yekhanin, et al. 2024, "Differentially Private Synthetic Data via Foundation
  Model APIs 2: Text" (Aug-PE, ICML 2024).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from synthgen.privacy import accountants, calibration, events

RELATION = "ADD_OR_REMOVE_ONE"


def _check_votes(votes: int) -> None:
    if votes < 1:
        raise ValueError(f"votes must be >= 1, got {votes=}")


def nearest_neighbour_votes(
    private: np.ndarray,
    candidates: np.ndarray,
    *,
    votes: int = 1,
    private_groups: Sequence[int] | None = None,
    candidate_groups: Sequence[int] | None = None,
    chunk: int = 1024,
) -> np.ndarray:
    """Exact vote counts [num_candidates]: each private row's `votes` nearest candidates +1.

    Distance is Euclidean (on unit-norm embeddings, the same order as cosine). A private row
    votes only among candidates of its own group; a group with fewer than `votes`
    candidates gets one vote per candidate; a private row whose group has no candidate
    casts no vote. Ties go to the lower candidate index.

    Args:
      private: private embeddings [N, d].
      candidates: candidate (synthetic) embeddings [C, d].
      votes: k, the nearest candidates each private row votes for.
      private_groups: group id per private row (None: one group).
      candidate_groups: group id per candidate (None: one group).
      chunk: private rows per matrix product (bounds memory; the last block is padded to
        it, so the product's shape never depends on the number of private rows).

    Returns:
      float64 counts [C]; their sum is at most `votes` per private row.
    """
    _check_votes(votes)
    private = np.asarray(private, np.float32)
    candidates = np.asarray(candidates, np.float32)
    if private.ndim != 2 or candidates.ndim != 2 or private.shape[1] != candidates.shape[1]:
        # widths only: the number of private rows is not public
        raise ValueError(
            f"need [N, d] private and [C, d] candidate embeddings of one width d, got widths "
            f"{private.shape[-1]} and {candidates.shape[-1]}"
        )
    counts = np.zeros(len(candidates), np.float64)
    p_groups = np.zeros(len(private), np.int64) if private_groups is None else np.asarray(
        private_groups, np.int64
    )  # fmt: skip
    c_groups = np.zeros(len(candidates), np.int64) if candidate_groups is None else np.asarray(
        candidate_groups, np.int64
    )  # fmt: skip
    if len(p_groups) != len(private) or len(c_groups) != len(candidates):
        raise ValueError("one group id per row is needed")
    for group in np.unique(c_groups):
        members = np.flatnonzero(c_groups == group)
        rows = private[p_groups == group]
        if not len(rows):
            continue
        k = min(votes, len(members))
        cand = candidates[members]
        cand_sq = np.sum(cand.astype(np.float64) ** 2, 1)
        for start in range(0, len(rows), chunk):
            block = rows[start : start + chunk]
            real = len(block)
            if real < chunk:  # one product shape whatever N: a row's rounding stays its own
                pad = np.zeros((chunk - real, block.shape[1]), block.dtype)
                block = np.concatenate([block, pad])
            # ||p - c||^2 = ||p||^2 - 2 p.c + ||c||^2; ||p||^2 does not change the order
            dist = cand_sq[None, :] - 2.0 * (block.astype(np.float64) @ cand.T.astype(np.float64))
            order = np.argsort(dist[:real], axis=1, kind="stable")[:, :k]
            np.add.at(counts, members[order.ravel()], 1.0)
    return counts


def nn_histogram_event(noise_multiplier: float, iterations: int = 1):
    """dp-accounting event of `iterations` histograms of noise multiplier sigma / sqrt(k)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier=}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations=}")
    return events.self_composed(events.gaussian_event(noise_multiplier), iterations)


@functools.lru_cache(maxsize=64)
def calibrate_nn_histogram(
    target_epsilon: float, delta: float, iterations: int, *, tolerance: float = 1e-3
) -> float:
    """Smallest noise multiplier (within `tolerance`) making `iterations` histograms
    (target_epsilon, delta)-DP under the PLD accountant (memoised: plans are rechecked)."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon=}")
    events.check_open_delta(delta)

    def eps(z: float) -> float:
        return accountants.epsilon(nn_histogram_event(z, iterations), delta)

    def fits(z: float) -> bool:
        return eps(z) <= target_epsilon

    low, high = calibration.grow(
        lambda z: not fits(z),
        0.25,
        1.0,
        limit=1e4,
        error=f"no noise multiplier <= 1e4 reaches {target_epsilon=}",
    )
    if fits(low):  # the floor: more noise than needed, never less
        return low
    return float(calibration.bisect(fits, high, low, abs_tol=tolerance))


def dp_nn_histogram(
    counts: np.ndarray,
    *,
    noise_multiplier: float,
    votes: int,
    threshold: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """The released histogram: counts + N(0, (sigma sqrt(votes))^2), below `threshold` -> 0.

    Args:
      counts: exact vote counts from `nearest_neighbour_votes` (private).
      noise_multiplier: sigma; the noise std is sigma * sqrt(votes), the L2 sensitivity.
      votes: k, the votes per private sample.
      threshold: public cut-off on the noisy counts.
      rng: the mechanism's secret randomness (production: `secure_rng()`).

    Returns:
      float64 noisy counts [C], zero where below the threshold.

    Privacy:
      Gaussian mechanism, L2 sensitivity sqrt(votes) under add/remove-one (see the module
      docstring); one call is `nn_histogram_event(noise_multiplier)`. Nothing about the
      exact counts is returned but the noisy vector.
    """
    _check_votes(votes)
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier=}")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold=}")
    std = noise_multiplier * math.sqrt(votes)
    noisy = np.asarray(counts, np.float64) + rng.normal(0.0, std, np.shape(counts))
    return np.where(noisy >= threshold, noisy, 0.0)

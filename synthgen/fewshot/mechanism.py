"""The release of one token: M next-token distributions -> one DP token (RVP, prior).

Each row is normalised to a distribution (`distributions`), the M private rows averaged
(`private_mean`), and one token released among the candidates (`public_candidates`) by the
Gaussian mechanism + argmax or the exponential mechanism (`release_token`).

Privacy:
  Unit: one private example; add/remove-one. One example changes at most one of the M
  prompts, so the mean moves by at most sqrt(2)/M in L2 and 1/M in L-infinity; the
  mechanisms are `synthgen.privacy.mechanisms`'; the candidates and the public prior read
  only the public row (Tang et al. 2024).
"""

from __future__ import annotations

import math

import numpy as np

from synthgen.fewshot.config import FewShotConfig
from synthgen.fewshot.plan import FewShotPlan
from synthgen.privacy import mechanisms


def distributions(logprobs: np.ndarray) -> np.ndarray:
    """Rows of log-probs [B, V] -> probability distributions (float64, each sums to 1).

    Whatever a backend returns (rows summing to 1.8, NaN, +inf), each row is mapped on its
    own to the simplex: non-finite or negative probabilities count as 0, the row is divided
    by its sum, and an all-zero row becomes uniform. The sqrt(2) sensitivity of the mean
    needs exactly this: each prompt's row a distribution that depends on that prompt only.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        probs = np.exp(np.asarray(logprobs, np.float64))
    probs = np.where(np.isfinite(probs) & (probs > 0), probs, 0.0)
    totals = probs.sum(axis=-1, keepdims=True)
    uniform = np.full_like(probs, 1.0 / probs.shape[-1])
    return np.where(totals > 0, probs / np.where(totals > 0, totals, 1.0), uniform)


def private_mean(logprobs: np.ndarray) -> np.ndarray:
    """Mean of the M private next-token distributions (rows 1..M of [1 + M, V] log-probs).

    The statistic each token's mechanism releases (sensitivity: the module docstring).
    """
    return distributions(logprobs[1:]).mean(axis=0)


def public_candidates(public: np.ndarray, config: FewShotConfig) -> np.ndarray:
    """Candidate token ids: all, or the K most likely under the public distribution plus
    the config's public `extra_candidates`."""
    if config.public_vocab is None:
        return np.arange(public.size)
    k = min(config.public_vocab, public.size)
    top = np.argpartition(-public, k - 1)[:k]
    if not config.extra_candidates:
        return top
    extra = np.asarray(config.extra_candidates, np.int64)
    extra = extra[extra < public.size]
    return np.union1d(top, extra)


def release_token(
    logprobs: np.ndarray,
    config: FewShotConfig,
    plan: FewShotPlan,
    rng: np.random.Generator,
) -> int:
    """Releases one token from log-probs [1 + M, V]: row 0 public, rows 1..M private.

    Privacy:
      One Gaussian (L2 sensitivity sqrt(2)/M) or token_epsilon-DP exponential (L-inf 1/M)
      mechanism on the private mean; candidates and prior read the public row only (module
      docstring; Tang et al. 2024).
    """
    m = config.subsets
    if logprobs.shape[0] != m + 1:
        raise ValueError(f"expected {m + 1} rows of log-probs, got {logprobs.shape[0]}")
    public = distributions(logprobs[:1])[0]
    candidates = public_candidates(public, config)
    mean = private_mean(logprobs)[candidates]
    prior = config.public_prior * public[candidates]
    if plan.mechanism == "gaussian":
        noisy = mechanisms.gaussian_mechanism(
            mean, sensitivity=math.sqrt(2) / m, noise_multiplier=plan.noise_multiplier, rng=rng
        )
        return int(candidates[np.argmax(noisy + prior)])
    if config.public_prior:
        # exp-mechanism on u + lambda * p_pub: the public term does not change sensitivity.
        mean = mean + prior
    choice = mechanisms.exponential_mechanism(
        mean, epsilon=plan.token_epsilon, sensitivity=1.0 / m, rng=rng
    )
    return int(candidates[choice])

"""DP in-context aggregation: one answer token from per-document next-token distributions.

Grislain 2024 ("RAG with differential privacy", Sec. 4; reference code sarus-tech/dp-rag):
every privately selected document gets its own prompt, and one public prompt holds no
document. For each prompt the next-token log-probabilities are shifted so their maximum is
0, transformed by f(x) = (exp(alpha * x) - 1) / alpha (alpha -> 0 keeps log-probabilities,
alpha = 1 gives p / p_max - 1), centred on the midpoint of their range and clipped to
L-infinity norm <= C. The clipped vectors are summed, theta * log p_public is added, and one
token is drawn by the exponential mechanism over the whole vocabulary: no candidate list is
cut from private scores.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from synthgen.privacy import exponential_mechanism

# Public log-probabilities of -inf (tokens a model never emits) become this finite floor.
PUBLIC_LOGPROB_FLOOR = -1e4


@dataclasses.dataclass(frozen=True)
class AggregationConfig:
    """Public parameters of the aggregation.

    Attributes:
      alpha: transform of the shifted log-probabilities (> 0).
      clip: L-infinity clip C of each document's centred vector (> 0); the utility's
        sensitivity. The transformed range is 1 / alpha, so C >= 1 / (2 alpha) never clips.
      theta: weight of the public prompt's log-probabilities (>= 0).
    """

    alpha: float = 1.0
    clip: float = 0.5
    theta: float = 0.1

    def __post_init__(self) -> None:
        for name in ("alpha", "clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {self=}")
        if not (math.isfinite(self.theta) and self.theta >= 0):
            raise ValueError(f"theta must be finite and >= 0, got {self.theta=}")


def clipped_contributions(logprobs: np.ndarray, config: AggregationConfig) -> np.ndarray:
    """Each row's transformed, centred and clipped vector, shape [M, V], |x| <= clip."""
    rows = np.asarray(logprobs, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"logprobs must be [M, V], got shape={rows.shape}")
    if rows.shape[0] == 0:
        return rows
    if np.any(np.isnan(rows)) or np.any(rows == np.inf):
        raise ValueError("logprobs must not hold NaN or +inf")
    if np.any(np.all(rows == -np.inf, axis=1)):
        raise ValueError("a row of logprobs is -inf everywhere: not a distribution")
    shifted = rows - np.max(rows, axis=1, keepdims=True)  # <= 0; -inf allowed
    transformed = np.expm1(config.alpha * shifted) / config.alpha  # in [-1/alpha, 0]
    low, high = transformed.min(axis=1, keepdims=True), transformed.max(axis=1, keepdims=True)
    centred = transformed - (low + high) / 2.0
    norms = np.max(np.abs(centred), axis=1, keepdims=True)
    scale = np.minimum(1.0, config.clip / np.maximum(norms, 1e-300))
    return centred * scale


def token_utilities(
    private_logprobs: np.ndarray, public_logprobs: np.ndarray, config: AggregationConfig
) -> np.ndarray:
    """u_v = sum over documents of the clipped vectors + theta * log p_public(v), shape [V]."""
    public = np.asarray(public_logprobs, dtype=np.float64)
    if public.ndim != 1:
        raise ValueError(f"public_logprobs must be [V], got shape={public.shape}")
    private = np.asarray(private_logprobs, dtype=np.float64).reshape(-1, public.size)
    summed = clipped_contributions(private, config).sum(axis=0)
    floor = np.where(np.isfinite(public), public, PUBLIC_LOGPROB_FLOOR)
    return summed + config.theta * np.maximum(floor, PUBLIC_LOGPROB_FLOOR)


def token_probabilities(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    epsilon: float,
    config: AggregationConfig,
) -> np.ndarray:
    """The closed form of `dp_icl_token`'s distribution (for tests and diagnostics)."""
    logits = (
        epsilon * token_utilities(private_logprobs, public_logprobs, config) / (2.0 * config.clip)
    )
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def dp_icl_token(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    epsilon: float,
    config: AggregationConfig,
    rng: np.random.Generator,
) -> int:
    """Draws one answer token from the aggregated per-document distributions.

    Args:
      private_logprobs: [M, V] next-token log-probabilities, one row per selected document
        (M may be 0: then only the public prompt speaks).
      public_logprobs: [V] next-token log-probabilities of the public prompt.
      epsilon: this token's privacy parameter.
      config: alpha, clip C and theta.
      rng: source of randomness.

    Returns:
      The token id, drawn with probability proportional to exp(epsilon * u_v / (2 C)).

    Privacy:
      Privacy unit: one document of the private collection (add/remove-one), given the
      released threshold of the DP retrieval. A document adds or removes one row, whose
      contribution lies in [-C, C] in every coordinate, so the utility vector has
      L-infinity sensitivity C and the exponential mechanism over the full vocabulary is
      epsilon-DP and epsilon-bounded-range (McSherry & Talwar 2007; Dong, Durfee & Rogers
      2020). The public term does not depend on the collection. Account with
      `pure_epsilon_event(epsilon)` per token, or the bounded-range analysis of
      `retriever.rag.accounting` (Grislain 2024).
    """
    utilities = token_utilities(private_logprobs, public_logprobs, config)
    return exponential_mechanism(utilities, epsilon=epsilon, sensitivity=config.clip, rng=rng)

"""DP in-context aggregation: one answer token from per-document next-token distributions.

Grislain 2024 ("RAG with differential privacy", Sec. 4; reference code sarus-tech/dp-rag):
each selected document's prompt gives next-token log-probabilities, shifted so their maximum
is 0, transformed by f(x) = (exp(alpha * x) - 1) / alpha, centred on the midpoint of their
range and clipped to L-infinity norm <= C. Their sum u is the utility of one exponential
mechanism draw over the whole vocabulary, with the public prompt's (no document)
distribution as its base measure:

    P(v) ∝ p_public(v)^beta(epsilon) * exp(epsilon * u(v) / (2 C)).

Grislain's theta * log p_public inside the utility vanishes at small epsilon (token salad);
as a base measure it keeps its weight, with beta a public function of the token's epsilon
(`AggregationConfig.public_power`). See docs/guides/dp_rag.md ("icl: the exponential
mechanism with a public base measure").
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
      beta: power of the public distribution in the base measure at token epsilon -> 0
        (>= 0; 0: uniform; above 1 it sharpens the public LM towards its greedy text).
      beta_fade_epsilon: the power fades linearly to 0 at this token epsilon (inf: never).
    """

    alpha: float = 1.0
    clip: float = 0.5
    beta: float = 2.0  # defaults chosen on scripts/dp_rag_eval.py (docs/results/tables.md)
    beta_fade_epsilon: float = 2.0

    def __post_init__(self) -> None:
        for name in ("alpha", "clip", "beta_fade_epsilon"):
            value = getattr(self, name)
            if not (value > 0 and (math.isfinite(value) or name == "beta_fade_epsilon")):
                raise ValueError(f"{name} must be > 0 (finite but beta_fade_epsilon), {self=}")
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be finite and >= 0, got {self.beta=}")

    def public_power(self, token_epsilon: float) -> float:
        """beta(epsilon) = beta * max(0, 1 - epsilon / beta_fade_epsilon): public, from the
        token's public epsilon only."""
        return self.beta * max(0.0, 1.0 - token_epsilon / self.beta_fade_epsilon)


def clipped_contributions(logprobs: np.ndarray, config: AggregationConfig) -> np.ndarray:
    """Each row's transformed, centred and clipped vector, shape [M, V], ``|x| <= clip``."""
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
    private_logprobs: np.ndarray,
    vocab_size: int,
    config: AggregationConfig,
    weights: np.ndarray | None = None,
):
    """u_v = the sum over documents of the clipped vectors, shape [V] (zeros for no rows).

    `weights` (0 or 1 per row; default all 1) masks padding rows out of the sum, so a batch
    of a fixed public shape costs the same whichever rows are real.
    """
    private = np.asarray(private_logprobs, dtype=np.float64).reshape(-1, vocab_size)
    contributions = clipped_contributions(private, config)
    if weights is None:
        return contributions.sum(axis=0)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (private.shape[0],) or not np.all((weights == 0) | (weights == 1)):
        raise ValueError(f"weights must be 0 or 1, one per row: {weights.shape=}")
    return weights @ contributions


def log_base_measure(
    public_logprobs: np.ndarray, *, epsilon: float, config: AggregationConfig
) -> np.ndarray:
    """beta(epsilon) * log p_public(v), shape [V]; -inf entries floored (finite)."""
    public = np.asarray(public_logprobs, dtype=np.float64)
    if public.ndim != 1:
        raise ValueError(f"public_logprobs must be [V], got shape={public.shape}")
    if np.any(np.isnan(public)) or np.any(public == np.inf):
        raise ValueError("public_logprobs must not hold NaN or +inf")
    floored = np.maximum(
        np.where(np.isfinite(public), public, PUBLIC_LOGPROB_FLOOR), PUBLIC_LOGPROB_FLOOR
    )
    return config.public_power(epsilon) * floored


def utility_sensitivity(config: AggregationConfig, *, capped: bool) -> float:
    """L-infinity sensitivity of the utility: C, or 2C when a public cap on rows can swap
    one document's row for another's (`dp_icl_token`)."""
    return 2.0 * config.clip if capped else config.clip


def token_probabilities(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    epsilon: float,
    config: AggregationConfig,
    weights: np.ndarray | None = None,
    capped: bool = False,
) -> np.ndarray:
    """The closed form of `dp_icl_token`'s distribution (for tests and diagnostics)."""
    base = log_base_measure(public_logprobs, epsilon=epsilon, config=config)
    utilities = token_utilities(private_logprobs, base.size, config, weights)
    sensitivity = utility_sensitivity(config, capped=capped)
    logits = base + epsilon * utilities / (2.0 * sensitivity)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def dp_icl_token(
    private_logprobs: np.ndarray,
    public_logprobs: np.ndarray,
    *,
    epsilon: float,
    config: AggregationConfig,
    rng: np.random.Generator,
    capped: bool,
    weights: np.ndarray | None = None,
) -> int:
    """Draws one answer token from the aggregated per-document distributions.

    Args:
      private_logprobs: [R, V] next-token log-probabilities, one row per selected document
        or padding row (R may be 0: then only the public prompt speaks).
      public_logprobs: [V] next-token log-probabilities of the public prompt.
      epsilon, config, rng: this token's epsilon; alpha, clip C and beta; randomness.
      capped: the rows are the best R of the selection for a public cap R, so a document
        can displace another's row (required: a capped caller that forgot it would run
        at half the sensitivity it needs).
      weights: 1 for a document's row, 0 for a padding row (default: all documents).

    Returns:
      The token id, drawn with probability proportional to
      p_public(v)^beta(epsilon) * exp(epsilon * u_v / (2 S)), S = C, or 2C when `capped`.

    Privacy:
      Privacy unit: one document (add/remove-one), given the released DP threshold. A
      document adds or removes one row, each coordinate in [-C, C]: L-infinity
      sensitivity C, or 2C under a public cap on rows, where it may also displace the
      last row. The exponential mechanism over the full vocabulary at that sensitivity is
      epsilon-DP and epsilon-bounded-range (McSherry & Talwar 2007; Dong, Durfee & Rogers
      2020). Padding rows carry weight 0 and a public prompt. The base measure comes from
      the public prompt and the public epsilon only, and a data-independent base measure
      leaves the guarantee unchanged (McSherry & Talwar 2007). Account with
      `pure_epsilon_event(epsilon)` per token, or the bounded-range analysis of
      `retriever.rag.accounting` (Grislain 2024).
    """
    base = log_base_measure(public_logprobs, epsilon=epsilon, config=config)
    utilities = token_utilities(private_logprobs, base.size, config, weights)
    return exponential_mechanism(
        utilities,
        epsilon=epsilon,
        sensitivity=utility_sensitivity(config, capped=capped),
        rng=rng,
        log_base_measure=base,
    )

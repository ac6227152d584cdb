"""Next-token sampling from logits: greedy, temperature, top-k, nucleus (top-p).

Pure jnp functions with static settings, usable inside `jax.jit` and `lax` loops. Every random
choice takes an explicit PRNG key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from synthgen.models.sampling_config import SamplingConfig

__all__ = ["SamplingConfig", "filter_logits", "sample_next"]


def filter_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """Applies temperature, top-k and top-p to logits [..., V]; removed tokens get -inf."""
    logits = logits.astype(jnp.float32) / max(config.temperature, 1e-6)
    if config.top_k > 0 and config.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, config.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if config.top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Mass strictly before each token; keep a token while that mass is < p (the top
        # token is always kept).
        before = jnp.cumsum(probs, axis=-1) - probs
        keep = before < config.top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def sample_next(logits: jax.Array, key: jax.Array, config: SamplingConfig) -> jax.Array:
    """Picks one token id per row of logits [B, V] -> int32 [B]."""
    if config.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, config)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)

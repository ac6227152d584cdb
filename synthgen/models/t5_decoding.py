"""Autoregressive T5 decoding with a KV cache, compiled once per static shape.

The encoder runs once per batch; each decoder layer's cross-attention keys and values are
projected once; the decoder's self-attention keys and values live in a fixed-size cache
[B, max_new_tokens, H, d_kv] that each step writes at its position. Steps run in a
`lax.while_loop` that stops when every row has emitted EOS (or after `max_new_tokens`), so
there is no Python loop over tokens and no recompilation across batches of the same shape.

Randomness: step t draws with `fold_in(key, t)`; rows of a batch draw independently.
With `num_samples` > 1, sample s of input b is row b * num_samples + s of the decoder; the
encoder, the cross-attention projections and the cross-attention keys/values stay at one row
per input (the samples of an input are queries of one cross attention), so memory traffic per
step does not grow with the samples' copies of the encoder states.

References:
  google-research/t5x `t5x/decoding.py` (temperature sampling with a cache).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from synthgen.models.sampling import SamplingConfig, sample_next
from synthgen.models.t5 import T5, T5Config

PyTree = Any
Cache = list[tuple[jax.Array, jax.Array]]


def init_cache(config: T5Config, batch: int, max_len: int) -> Cache:
    """Zeroed self-attention cache: per decoder layer (k, v) [batch, max_len, H, d_kv]."""
    shape = (batch, max_len, config.num_heads, config.d_kv)
    dtype = config.compute_dtype
    return [
        (jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(config.num_decoder_layers)
    ]


def prepare_decoding(
    config: T5Config, params: PyTree, input_ids: jax.Array, attention_mask: jax.Array
) -> list[tuple[jax.Array, jax.Array]]:
    """Runs the encoder and returns each decoder layer's cross-attention (k, v)."""
    model = T5(config)
    variables = {"params": params}
    encoded = model.apply(variables, input_ids, attention_mask, method=T5.encode)
    return model.apply(variables, encoded, method=T5.cross_kv)


def decode_step(
    config: T5Config,
    params: PyTree,
    token: jax.Array,
    index: jax.Array,
    cache: Cache,
    cross: list[tuple[jax.Array, jax.Array]],
    attention_mask: jax.Array,
) -> tuple[jax.Array, Cache]:
    """Logits [B, V] of the next token after `token` [B] at position `index`, and the cache."""
    return T5(config).apply(
        {"params": params}, token, index, cache, cross, attention_mask, method=T5.decode_step
    )


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "sampling", "num_samples"))
def _generate(
    config, params, input_ids, attention_mask, key, *, max_new_tokens, sampling, num_samples
):
    cross = prepare_decoding(config, params, input_ids, attention_mask)
    mask = attention_mask
    rows = input_ids.shape[0] * num_samples
    pad, eos = config.pad_token_id, config.eos_token_id

    def cond(state):
        step, _, _, done, _ = state
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(state):
        step, token, cache, done, out = state
        logits, cache = decode_step(config, params, token, step, cache, cross, mask)
        nxt = sample_next(logits, jax.random.fold_in(key, step), sampling)
        nxt = jnp.where(done, pad, nxt)
        out = jax.lax.dynamic_update_slice_in_dim(out, nxt[:, None], step, axis=1)
        return step + 1, nxt, cache, done | (nxt == eos), out

    state = (
        jnp.asarray(0, jnp.int32),
        jnp.full((rows,), config.decoder_start_token_id, jnp.int32),
        init_cache(config, rows, max_new_tokens),
        jnp.zeros((rows,), bool),
        jnp.full((rows, max_new_tokens), pad, jnp.int32),
    )
    return jax.lax.while_loop(cond, body, state)[-1]


def t5_generate(
    config: T5Config,
    params: PyTree,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    key: jax.Array,
    num_samples: int = 1,
) -> jax.Array:
    """Generates continuations of each input; output positions after EOS hold the pad id.

    Args:
      config: model configuration (static: one compilation per config and shape).
      params: model parameters (LoRA adapters included if the config has them).
      input_ids: encoder inputs int [B, S], EOS-terminated and right-padded.
      attention_mask: [B, S], 1 for real tokens.
      max_new_tokens: generated length (>= 1).
      sampling: greedy (temperature 0), temperature, top-k and top-p settings.
      key: PRNG key; unused by greedy decoding.
      num_samples: samples per input.

    Returns:
      int32 [B * num_samples, max_new_tokens]; row b * num_samples + s is sample s of input b.

    Raises:
      ValueError: max_new_tokens or num_samples < 1, or mismatched shapes.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens=}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples=}")
    input_ids = jnp.asarray(input_ids, jnp.int32)
    attention_mask = jnp.asarray(attention_mask, jnp.int32)
    if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"need input_ids and attention_mask [B, S], got {input_ids.shape=}, "
            f"{attention_mask.shape=}"
        )
    return _generate(
        config,
        params,
        input_ids,
        attention_mask,
        key,
        max_new_tokens=int(max_new_tokens),
        sampling=sampling,
        num_samples=int(num_samples),
    )

"""Incremental decoding of `synthgen.models.llama` with a KV cache: `prefill`, `extend`, `step`.

Use: `init_cache`, then `prefill` once with the (padded) prompts, then `step` one token per
row at a time; `extend` feeds a block of tokens after a cached prefix (a chunked prefill: a
document's keys computed once, a question after it). The cache has static shapes and carries
the config as static pytree metadata, so ``jax.jit(step, donate_argnums=1)`` works as is.

The layers run one by one, each over its own parameter arrays (`decode_params`, split once
outside jit) and cache buffers (written in place when donated), not as the training
forward's `nn.scan`, whose slices XLA:CPU copies (docs/results/benchmarks.md).

Cache layout: per layer, keys and values [B, K, S, D] (slots next to each other per row and
kv head, what the attention products read fastest), shared slot numbering: `prefill` writes
the T prompt tokens into slots 0..T-1 and records which slots hold real tokens (``mask``);
each `step` writes slot ``index`` for every row. RoPE positions are per row (``positions``:
the number of real tokens so far), so left-, right- or mixed-padded prompts of different
lengths decode exactly as they would alone.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from synthgen.models.llama import DecoderLayer, Llama, LlamaConfig, rope_tables

PyTree = Any


@flax.struct.dataclass
class KVCache:
    """Decoding state of a batch of B rows (a pytree; `config` is static metadata).

    Attributes:
      k: per layer, the cached rotated keys [B, K, S, D] (config dtype): L arrays.
      v: per layer, the cached values [B, K, S, D].
      mask: bool [B, S], True where a slot holds a real token of that row.
      positions: int32 [B], RoPE position of each row's next token.
      index: int32 scalar, the next slot to write (shared by all rows).
      config: the model config the cache belongs to.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array
    positions: jax.Array
    index: jax.Array
    config: LlamaConfig = flax.struct.field(pytree_node=False)

    @property
    def max_len(self) -> int:
        """Number of slots S."""
        return self.mask.shape[1]

    @property
    def batch(self) -> int:
        """Number of rows B."""
        return self.mask.shape[0]


def init_cache(config: LlamaConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens (prompt + generated)."""
    if batch <= 0 or max_len <= 0:
        raise ValueError(f"batch and max_len must be positive, got {batch=} {max_len=}")
    shape = (batch, config.num_kv_heads, max_len, config.head_dim)
    return KVCache(
        k=tuple(jnp.zeros(shape, config.jnp_dtype) for _ in range(config.num_layers)),
        v=tuple(jnp.zeros(shape, config.jnp_dtype) for _ in range(config.num_layers)),
        mask=jnp.zeros((batch, max_len), bool),
        positions=jnp.zeros((batch,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
        config=config,
    )


def decode_params(params: PyTree) -> PyTree:
    """`params` with ``layers`` as a tuple of per-layer trees (the stacked [L, ...] split).

    Call it once outside jit and pass the result to `prefill` / `extend` / `step` (they
    accept either form; given stacked parameters they split them inside the trace, which
    inside a jitted step means a copy of every weight per call). Idempotent.
    """
    layers = params["layers"]
    if isinstance(layers, tuple | list):
        return params
    count = jax.tree_util.tree_leaves(layers)[0].shape[0]
    split = tuple(jax.tree_util.tree_map(lambda a, i=i: a[i], layers) for i in range(count))
    return {**params, "layers": split}


def prefill(
    params: PyTree, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, KVCache]:
    """Starts decoding: runs the prompts and fills the cache (its old content is dropped).

    Args:
      params: the decoder's parameters (stacked or from `decode_params`).
      cache: a cache from `init_cache` with batch B and at least T slots.
      input_ids: int [B, T] prompts, padded on either side (or both).
      attention_mask: [B, T], 1 for real prompt tokens; every row needs at least one.

    Returns:
      Logits [B, V] (float32) after each row's last real token, and the filled cache.
    """
    if input_ids.shape[1] > cache.max_len:
        raise ValueError(f"prompt longer than the cache: {input_ids.shape[1]=} > {cache.max_len=}")
    empty = cache.replace(
        mask=jnp.zeros_like(cache.mask),
        positions=jnp.zeros_like(cache.positions),
        index=jnp.zeros_like(cache.index),
    )
    return extend(params, empty, input_ids, attention_mask)


def extend(
    params: PyTree, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, KVCache]:
    """Feeds a block of T tokens per row after what the cache holds (a chunked prefill).

    The block goes into slots ``cache.index`` .. ``cache.index + T - 1``; each row's real
    tokens (``attention_mask``) continue that row's RoPE positions and see the row's cached
    slots and its earlier real tokens of the block, so a prompt fed as a prefix (`prefill`,
    or slots filled by the caller) and then extended decodes as it would from one `prefill`
    of the whole prompt. Slots of masked tokens are never attended.

    Args:
      params: the decoder's parameters (stacked or from `decode_params`).
      cache: a cache with at least ``index + T`` slots: ``index`` is traced, so only
        ``T <= S`` is checked here; past the last slot the write would be clamped onto
        earlier slots.
      input_ids: int [B, T], padded on either side.
      attention_mask: [B, T], 1 for real tokens; a row needs at least one real token here
        or one cached slot (otherwise its logits are meaningless).

    Returns:
      Logits [B, V] (float32) after each row's last real token of the block, and the cache.
    """
    b, t = input_ids.shape
    if t > cache.max_len:
        raise ValueError(f"block longer than the cache: {t=} > {cache.max_len=}")
    c = cache.config
    params = decode_params(params)
    outer = {name: value for name, value in params.items() if name != "layers"}
    block = attention_mask.astype(bool)
    positions = cache.positions[:, None] + jnp.cumsum(block, axis=1, dtype=jnp.int32) - 1
    zero, index = jnp.zeros((), jnp.int32), cache.index
    slot_mask = jax.lax.dynamic_update_slice(cache.mask, block, (zero, index))
    slots = jnp.arange(cache.max_len, dtype=jnp.int32)
    causal = slots[None, :] <= index + jnp.arange(t, dtype=jnp.int32)[:, None]  # [T, S]
    visible = slot_mask[:, None, :] & causal[None]  # [B, T, S]

    model = Llama(c)
    x = model.apply({"params": outer}, input_ids, method=Llama.embed_tokens)
    cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
    layer = DecoderLayer(c)
    ks, vs = [], []
    for layer_params, ck, cv in zip(params["layers"], cache.k, cache.v, strict=True):
        layer_cache = (ck, cv, index)
        x, (ck, cv, _) = layer.apply({"params": layer_params}, x, cos, sin, visible, layer_cache)
        ks.append(ck)
        vs.append(cv)
    last = t - 1 - jnp.argmax(block[:, ::-1], axis=1)
    logits = model.apply({"params": outer}, x[jnp.arange(b), last], method=Llama.logits)
    cache = cache.replace(
        k=tuple(ks),
        v=tuple(vs),
        mask=slot_mask,
        positions=cache.positions + jnp.sum(block, axis=1, dtype=jnp.int32),
        index=index + t,
    )
    return logits, cache


def step(params: PyTree, cache: KVCache, token_ids: jax.Array) -> tuple[jax.Array, KVCache]:
    """Feeds one token per row and returns the next-token logits [B, V] and the cache.

    The token goes into slot ``cache.index`` (the same for all rows) at each row's own
    RoPE position. Writing past the last slot is not checked inside jit (the write would
    be clamped onto the last slot); size the cache for prompt + new tokens.
    """
    ids = token_ids.astype(jnp.int32)[:, None]
    return extend(params, cache, ids, jnp.ones_like(ids))

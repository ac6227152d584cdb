"""Llama-architecture decoder in Flax linen, with an explicit KV cache for incremental decoding.

Architecture (Touvron et al. 2023): token embedding, `num_layers` pre-norm blocks of RMSNorm ->
grouped-query self-attention with rotary position embeddings -> residual, RMSNorm -> SwiGLU
MLP -> residual, a final RMSNorm and an (optionally tied) output projection. RoPE follows the
Hugging Face ``rotate_half`` convention (the two halves of each head are the real and
imaginary parts), so HF checkpoints load as they are and llama.cpp's GGUF q/k rows are
un-permuted at load time (`synthgen.models.llama_loading`).

Layers are one `nn.scan` over a stacked parameter tree (leading axis = layer), so the 30-layer
SmolLM2 compiles one block instead of thirty. Parameter tree::

    embed/embedding [V, d]
    layers/attn_norm/scale [L, d]       layers/mlp_norm/scale [L, d]
    layers/attn/{q,k,v,o}/kernel [L, in, out] (+ lora_a [L, in, r], lora_b [L, r, out])
    layers/mlp/{gate,up,down}/kernel [L, in, out] (+ LoRA)
    final_norm/scale [d]
    lm_head/kernel [d, V]               (absent when tie_word_embeddings)

Two ways to run it:

* Training / scoring: ``Llama(cfg).apply({"params": p}, input_ids, attention_mask)`` returns
  logits [B, T, V] for every position (causal, padding keys masked). It has no batch
  statistics, so it runs under ``jax.vmap`` over a per-example axis with B = 1.
* Incremental decoding: `init_cache`, then `prefill` once with the (padded) prompts, then
  `step` one token per row at a time; `extend` feeds a block of tokens after a cached
  prefix (a chunked prefill: a document's keys computed once, a question after it). The
  cache has static shapes and carries the config as static pytree metadata, so
  ``jax.jit(step, donate_argnums=1)`` works as is.

Cache layout: ``k``/``v`` [L, B, S, K, D] are slot buffers shared by the batch. `prefill`
writes the T prompt tokens into slots 0..T-1 and records which slots hold real tokens
(``mask``); each `step` writes slot ``index`` for every row. RoPE positions are per row
(``positions``: the number of real tokens so far), so left-, right- or mixed-padded prompts
of different lengths decode exactly as they would alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from synthgen.models.lora import LoraDense
from synthgen.models.taps import TAP_INPUTS, TAP_OUTPUTS, TappedEmbed

PyTree = Any

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
DTYPES = ("float32", "bfloat16", "float16")
_MASKED = float(jnp.finfo(jnp.float32).min)  # finite: a fully masked row gives no NaN


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shape and numerics of a Llama-architecture decoder.

    Attributes:
      vocab_size: number of token ids V.
      hidden_size: model width d.
      intermediate_size: SwiGLU hidden width.
      num_layers: decoder blocks L.
      num_heads: query heads H.
      num_kv_heads: key/value heads K (grouped-query attention); must divide `num_heads`.
      head_dim: per-head width D; None means ``hidden_size // num_heads`` (resolved at
        construction, so pass ``head_dim=None`` to `dataclasses.replace` when changing
        hidden_size or num_heads).
      rope_theta: RoPE base frequency.
      rms_norm_eps: epsilon of every RMSNorm.
      max_seq_len: longest sequence (prompt + generated) the model is meant to see.
      tie_word_embeddings: output projection is the transposed input embedding.
      lora_rank: rank r of the LoRA adapters; 0 disables them.
      lora_alpha: LoRA scale numerator (the update is scaled by alpha / r).
      lora_targets: projections that get adapters, among q, k, v, o, gate, up, down.
      dtype: computation and KV-cache dtype ("float32", "bfloat16", "float16"); parameters
        keep the dtype they are given, logits are always float32.
      remat: recompute each block in the backward pass (saves activation memory in training).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_word_embeddings: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q", "v")
    dtype: str = "float32"
    remat: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                "num_kv_heads must divide num_heads, got "
                f"{self.num_heads=} and {self.num_kv_heads=}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"num_heads must divide hidden_size, got {self.hidden_size=} {self.num_heads=}"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int, got {self.head_dim=}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta=}")
        if self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps=}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0, got {self.lora_rank=}")
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        unknown = set(self.lora_targets) - set(LORA_TARGETS)
        if unknown:
            raise ValueError(f"lora_targets must be among {LORA_TARGETS}, got {self.lora_targets=}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype=}")

    @property
    def jnp_dtype(self) -> jnp.dtype:
        """The computation dtype as a jnp dtype."""
        return jnp.dtype(self.dtype)

    @classmethod
    def tiny(cls, **overrides: Any) -> LlamaConfig:
        """A 2-layer, d=64, vocab 256 model for unit tests (fields can be overridden)."""
        fields = dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            max_seq_len=256,
        )
        fields.update(overrides)
        return cls(**fields)


# ---- rotary position embedding ----------------------------------------------------------


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """Per-row RoPE positions [B, T]: index of each token among the row's real tokens."""
    mask = attention_mask.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, D] (float32) for integer positions [B, T], HF layout (halves)."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, H, D] by the angles in cos/sin [B, T, D] (``rotate_half`` form)."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


# ---- layers -----------------------------------------------------------------------------


def _dense(config: LlamaConfig, features: int, name: str) -> LoraDense:
    rank = config.lora_rank if name in config.lora_targets else 0
    return LoraDense(
        features, rank=rank, alpha=config.lora_alpha, dtype=config.jnp_dtype, name=name
    )


def _rms_norm(config: LlamaConfig, name: str) -> nn.RMSNorm:
    return nn.RMSNorm(epsilon=config.rms_norm_eps, dtype=config.jnp_dtype, name=name)


class Attention(nn.Module):
    """Grouped-query causal self-attention with RoPE, optionally over cached keys too."""

    config: LlamaConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        self_mask: jax.Array,
        cache_kv: tuple[jax.Array, jax.Array] | None,
        cache_mask: jax.Array | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Attends x [B, T, d] to itself (under `self_mask` [B, T, T]) and to the cache.

        Args:
          x: block input [B, T, d].
          cos: RoPE cosines [B, T, D].
          sin: RoPE sines [B, T, D].
          self_mask: bool [B, T, T], query t may see key s of this block.
          cache_kv: cached keys and values [B, S, K, D] of earlier tokens, or None.
          cache_mask: bool [B, S], slots of the cache holding real tokens (with `cache_kv`).

        Returns:
          The attention output [B, T, d] and this block's (rotated) keys and values
          [B, T, K, D], to be written into a cache.
        """
        c = self.config
        b, t, _ = x.shape
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        dt = c.jnp_dtype
        q = _dense(c, h * d, "q")(x).reshape(b, t, h, d)
        k = _dense(c, kv * d, "k")(x).reshape(b, t, kv, d)
        v = _dense(c, kv * d, "v")(x).reshape(b, t, kv, d)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        q = (q * d**-0.5).reshape(b, t, kv, h // kv, d)  # [B, T, K, G, D]

        f32 = jnp.float32
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=f32)
        scores = jnp.where(self_mask[:, None, None], scores, _MASKED)
        if cache_kv is None:
            probs = jax.nn.softmax(scores, axis=-1).astype(dt)
            out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=f32)
        else:
            ck, cv = (a.astype(dt) for a in cache_kv)
            cached = jnp.einsum("btkgd,bskd->bkgts", q, ck, preferred_element_type=f32)
            cached = jnp.where(cache_mask[:, None, None, None, :], cached, _MASKED)
            s = cached.shape[-1]
            probs = jax.nn.softmax(jnp.concatenate([cached, scores], axis=-1), axis=-1).astype(dt)
            out = jnp.einsum("bkgts,bskd->btkgd", probs[..., :s], cv, preferred_element_type=f32)
            out = out + jnp.einsum(
                "bkgts,bskd->btkgd", probs[..., s:], v, preferred_element_type=f32
            )
        out = out.astype(dt).reshape(b, t, h * d)
        return _dense(c, c.hidden_size, "o")(out), (k, v)


class Mlp(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        gate = _dense(c, c.intermediate_size, "gate")(x)
        up = _dense(c, c.intermediate_size, "up")(x)
        return _dense(c, c.hidden_size, "down")(nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    """One pre-norm block; the call signature is `nn.scan`'s (carry, *inputs)."""

    config: LlamaConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        self_mask: jax.Array,
        cache_mask: jax.Array | None,
        cache_kv: tuple[jax.Array, jax.Array] | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        c = self.config
        h = _rms_norm(c, "attn_norm")(x)
        attn, new_kv = Attention(c, name="attn")(h, cos, sin, self_mask, cache_kv, cache_mask)
        x = x + attn
        x = x + Mlp(c, name="mlp")(_rms_norm(c, "mlp_norm")(x))
        return x, new_kv


# ---- KV cache ---------------------------------------------------------------------------


@flax.struct.dataclass
class KVCache:
    """Decoding state of a batch of B rows (a pytree; `config` is static metadata).

    Attributes:
      k: cached rotated keys [L, B, S, K, D] (config dtype).
      v: cached values [L, B, S, K, D].
      mask: bool [B, S], True where a slot holds a real token of that row.
      positions: int32 [B], RoPE position of each row's next token.
      index: int32 scalar, the next slot to write (shared by all rows).
      config: the model config the cache belongs to.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    positions: jax.Array
    index: jax.Array
    config: LlamaConfig = flax.struct.field(pytree_node=False)

    @property
    def max_len(self) -> int:
        """Number of slots S."""
        return self.k.shape[2]


def init_cache(config: LlamaConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens (prompt + generated)."""
    if batch <= 0 or max_len <= 0:
        raise ValueError(f"batch and max_len must be positive, got {batch=} {max_len=}")
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, config.jnp_dtype),
        v=jnp.zeros(shape, config.jnp_dtype),
        mask=jnp.zeros((batch, max_len), bool),
        positions=jnp.zeros((batch,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
        config=config,
    )


# ---- model ------------------------------------------------------------------------------


class Llama(nn.Module):
    """Llama-architecture causal decoder. See the module docstring for the parameter tree."""

    config: LlamaConfig

    def setup(self) -> None:
        c = self.config
        self.embed = TappedEmbed(
            c.vocab_size,
            c.hidden_size,
            embedding_init=nn.initializers.normal(stddev=0.02),
            dtype=c.jnp_dtype,
        )
        block = nn.remat(DecoderLayer) if c.remat else DecoderLayer
        self.layers = nn.scan(
            block,
            variable_axes={"params": 0, TAP_INPUTS: 0, TAP_OUTPUTS: 0},
            split_rngs={"params": True},
            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, 0),
            length=c.num_layers,
        )(c)
        self.final_norm = _rms_norm(c, "final_norm")
        if not c.tie_word_embeddings:
            self.lm_head = LoraDense(c.vocab_size, dtype=c.jnp_dtype)

    def _blocks(
        self,
        input_ids: jax.Array,
        positions: jax.Array,
        self_mask: jax.Array,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Hidden states [B, T, d] after the last block, and new keys/values [L, B, T, K, D]."""
        c = self.config
        x = self.embed(input_ids.astype(jnp.int32)).astype(c.jnp_dtype)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        cache_kv = None if cache is None else (cache.k, cache.v)
        cache_mask = None if cache is None else cache.mask
        return self.layers(x, cos, sin, self_mask, cache_mask, cache_kv)

    def _logits(self, h: jax.Array) -> jax.Array:
        h = self.final_norm(h)
        if self.config.tie_word_embeddings:
            return self.embed.attend(h).astype(jnp.float32)
        return self.lm_head(h).astype(jnp.float32)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        window_start: jax.Array | None = None,
        window_len: int | None = None,
    ) -> jax.Array:
        """Logits [B, T, V] (float32) of the next token at every position.

        Args:
          input_ids: int [B, T].
          attention_mask: [B, T], 1 for real tokens, 0 for padding (keys at padding are
            never attended to); None means all real.
          positions: int [B, T] RoPE positions; None means each token's index among its
            row's real tokens (so left padding does not shift positions).
          window_start: int [B]; with `window_len`, return only the logits of positions
            window_start .. window_start + window_len - 1 of each row (the LM head, which
            dominates the cost with a large vocabulary, runs on those positions only).
          window_len: static length of that window.

        Returns:
          float32 [B, T, V] (or [B, window_len, V]); values at padding positions are
          meaningless.
        """
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        if positions is None:
            positions = default_positions(mask)
        self_mask = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]
        h, _ = self._blocks(input_ids, positions, self_mask)
        if (window_start is None) != (window_len is None):
            raise ValueError("give both window_start and window_len, or neither")
        if window_len is not None:
            h = jax.vmap(lambda row, start: jax.lax.dynamic_slice_in_dim(row, start, window_len))(
                h, window_start.astype(jnp.int32)
            )
        return self._logits(h)

    def prefill(
        self, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array
    ) -> tuple[jax.Array, KVCache]:
        """Starts decoding: runs the prompts and fills the cache (its old content is dropped).

        Args:
          cache: a cache from `init_cache` with batch B and at least T slots.
          input_ids: int [B, T] prompts, padded on either side (or both).
          attention_mask: [B, T], 1 for real prompt tokens; every row needs at least one.

        Returns:
          Logits [B, V] (float32) after each row's last real token, and the filled cache.
        """
        b, t = input_ids.shape
        if t > cache.max_len:
            raise ValueError(f"prompt longer than the cache: {t=} > {cache.max_len=}")
        mask = attention_mask.astype(bool)
        self_mask = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]
        h, (k, v) = self._blocks(input_ids, default_positions(mask), self_mask)
        last = t - 1 - jnp.argmax(mask[:, ::-1], axis=1)
        logits = self._logits(h[jnp.arange(b), last])
        zero = jnp.zeros((), jnp.int32)
        cache = cache.replace(
            k=jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (zero,) * 5),
            v=jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (zero,) * 5),
            mask=jax.lax.dynamic_update_slice(jnp.zeros_like(cache.mask), mask, (zero, zero)),
            positions=jnp.sum(mask, axis=1, dtype=jnp.int32),
            index=jnp.asarray(t, jnp.int32),
        )
        return logits, cache

    def extend(
        self, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array
    ) -> tuple[jax.Array, KVCache]:
        """Feeds a block of T tokens per row after what the cache holds (a chunked prefill).

        The block goes into slots ``cache.index`` .. ``cache.index + T - 1``; each row's real
        tokens (``attention_mask``) continue that row's RoPE positions and see the row's
        cached slots and its earlier real tokens of the block, so a prompt fed as a prefix
        (`prefill`, or slots filled by the caller) and then extended decodes as it would
        from one `prefill` of the whole prompt. Slots of masked tokens are never attended.

        Args:
          cache: a cache with at least ``index + T`` slots: ``index`` is traced, so only
            ``T <= S`` is checked here; past the last slot the write would be clamped
            onto earlier slots.
          input_ids: int [B, T], padded on either side.
          attention_mask: [B, T], 1 for real tokens; a row needs at least one real token
            here or one cached slot (otherwise its logits are meaningless).

        Returns:
          Logits [B, V] (float32) after each row's last real token of the block, and the cache.
        """
        b, t = input_ids.shape
        if t > cache.max_len:
            raise ValueError(f"block longer than the cache: {t=} > {cache.max_len=}")
        mask = attention_mask.astype(bool)
        positions = cache.positions[:, None] + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
        self_mask = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]
        h, (k, v) = self._blocks(input_ids, positions, self_mask, cache)
        last = t - 1 - jnp.argmax(mask[:, ::-1], axis=1)
        logits = self._logits(h[jnp.arange(b), last])
        zero, idx = jnp.zeros((), jnp.int32), cache.index
        start = (zero, zero, idx, zero, zero)
        cache = cache.replace(
            k=jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), start),
            v=jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), start),
            mask=jax.lax.dynamic_update_slice(cache.mask, mask, (zero, idx)),
            positions=cache.positions + jnp.sum(mask, axis=1, dtype=jnp.int32),
            index=idx + t,
        )
        return logits, cache

    def step(self, cache: KVCache, token_ids: jax.Array) -> tuple[jax.Array, KVCache]:
        """Feeds one token per row and returns the next-token logits [B, V] and the cache.

        The token goes into slot ``cache.index`` (the same for all rows) at each row's own
        RoPE position. Writing past the last slot is not checked inside jit (the write
        would be clamped onto the last slot); size the cache for prompt + new tokens.
        """
        ids = token_ids.astype(jnp.int32)[:, None]
        b = ids.shape[0]
        self_mask = jnp.ones((b, 1, 1), bool)
        h, (k, v) = self._blocks(ids, cache.positions[:, None], self_mask, cache)
        logits = self._logits(h[:, 0])
        zero, idx = jnp.zeros((), jnp.int32), cache.index
        start = (zero, zero, idx, zero, zero)
        cache = cache.replace(
            k=jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), start),
            v=jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), start),
            mask=jax.lax.dynamic_update_slice(cache.mask, jnp.ones((b, 1), bool), (zero, idx)),
            positions=cache.positions + 1,
            index=idx + 1,
        )
        return logits, cache


def prefill(
    params: PyTree, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, KVCache]:
    """`Llama.prefill` of the model described by ``cache.config`` with `params`."""
    return Llama(cache.config).apply(
        {"params": params}, cache, input_ids, attention_mask, method=Llama.prefill
    )


def extend(
    params: PyTree, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array
) -> tuple[jax.Array, KVCache]:
    """`Llama.extend` of the model described by ``cache.config`` with `params`."""
    return Llama(cache.config).apply(
        {"params": params}, cache, input_ids, attention_mask, method=Llama.extend
    )


def step(params: PyTree, cache: KVCache, token_ids: jax.Array) -> tuple[jax.Array, KVCache]:
    """`Llama.step` of the model described by ``cache.config`` with `params`."""
    return Llama(cache.config).apply({"params": params}, cache, token_ids, method=Llama.step)


def init_params(config: LlamaConfig, key: jax.Array) -> PyTree:
    """Random parameters (for tests and from-scratch training), initialised under jit."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.jit(lambda k: Llama(config).init(k, ids)["params"])(key)

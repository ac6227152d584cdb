"""T5 encoder-decoder in Flax (Raffel et al. 2020), v1.0 and v1.1, numerically matching HF.

Architecture, as in Hugging Face `T5ForConditionalGeneration` (parity is proven by the golden
fixtures under `tests/fixtures/t5_tiny_*`):

* pre-norm blocks with RMS layer norm (no mean, no bias), residual stream in float32;
* attention without 1/sqrt(d) scaling; a learned relative position bias (bucketed, one table
  per stack, owned by the first layer in HF) is computed once per stack and shared by every
  layer; cross attention has no position bias;
* v1.0: ReLU feed-forward, LM head tied to the input embedding with the decoder output scaled
  by d_model**-0.5; v1.1: gated-GELU (tanh approximation) feed-forward and an untied head.

Every attention and feed-forward projection is a `LoraDense`, so LoRA adapters are switched on
by `T5Config.lora_rank > 0` without changing the names of the base weights. Matmuls run in
`T5Config.dtype` (e.g. bfloat16 on accelerators); norms, softmax and logits stay in float32.

Besides teacher forcing (`__call__`), the module exposes the pieces of KV-cache decoding used
by `synthgen.models.t5_decoding`: `encode`, `cross_kv` (cross-attention keys/values computed
once), and `decode_step` (one token against a fixed-size self-attention cache).

`T5Config` lives in `synthgen.models.t5_config` and is re-exported here.

References:
  Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
  Transformer"; google-research/t5x `t5x/examples/t5/network.py`; HF `modeling_t5.py`.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from synthgen.models.lora import LoraDense
from synthgen.models.t5_config import LORA_TARGET_NAMES, T5Config
from synthgen.models.taps import TappedEmbed

__all__ = [
    "LORA_TARGET_NAMES",
    "T5",
    "T5Config",
    "relative_position_buckets",
    "shift_right",
]

_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
}
_NEG = float(np.finfo(np.float32).min)  # additive mask value, as HF (no -inf: no NaN rows)


def shift_right(labels: jax.Array, decoder_start_token_id: int, pad_token_id: int) -> jax.Array:
    """Decoder inputs for teacher forcing: [start, labels[:-1]], with -100 replaced by pad."""
    labels = jnp.asarray(labels)
    start = jnp.full(labels.shape[:-1] + (1,), decoder_start_token_id, labels.dtype)
    shifted = jnp.concatenate([start, labels[..., :-1]], axis=-1)
    return jnp.where(shifted == -100, jnp.asarray(pad_token_id, labels.dtype), shifted)


@functools.lru_cache(maxsize=64)
def relative_position_buckets(
    query_len: int, key_len: int, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
    """Bucket ids int32 [query_len, key_len] of relative position key - query.

    Computed on the host with static shapes (a trace-time constant), in float32 exactly as HF
    computes it, so boundary positions fall in the same bucket.
    """
    rel = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]
    buckets = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).astype(rel.dtype) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    scaled = np.log(np.maximum(rel, 1).astype(np.float32) / np.float32(max_exact))
    scaled = scaled / np.float32(math.log(max_distance / max_exact))
    scaled = scaled * np.float32(num_buckets - max_exact)
    large = np.minimum(max_exact + scaled.astype(rel.dtype), num_buckets - 1)
    buckets += np.where(rel < max_exact, rel, large)
    buckets = buckets.astype(np.int32)
    buckets.setflags(write=False)  # shared by the cache
    return buckets


class T5LayerNorm(nn.Module):
    """RMS norm without mean subtraction or bias; statistics in float32."""

    epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
        return x * scale


def _dense(cfg: T5Config, name: str, features: int, fan_in: int) -> LoraDense:
    """Projection `name` with its LoRA rank, initialised N(0, 1/fan_in) as HF does."""
    return LoraDense(
        features,
        rank=cfg.lora_rank_for(name),
        alpha=cfg.lora_alpha,
        dtype=cfg.compute_dtype,
        kernel_init=nn.initializers.normal(fan_in**-0.5),
        name=name,
    )


class T5Attention(nn.Module):
    """Multi-head attention with q/k/v/o LoRA-ready projections and an additive bias."""

    config: T5Config

    def setup(self) -> None:
        cfg = self.config
        inner = cfg.num_heads * cfg.d_kv
        # HF's init: q is scaled down by d_kv since T5 does not scale the scores.
        self.q = _dense(cfg, "q", inner, cfg.d_model * cfg.d_kv)
        self.k = _dense(cfg, "k", inner, cfg.d_model)
        self.v = _dense(cfg, "v", inner, cfg.d_model)
        self.o = _dense(cfg, "o", cfg.d_model, inner)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _heads(self, x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:-1], self.config.num_heads, self.config.d_kv)

    def project_kv(self, kv_input: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys and values [B, S, H, d_kv] of `kv_input` [B, S, d_model]."""
        return self._heads(self.k(kv_input)), self._heads(self.v(kv_input))

    def attend(
        self, x: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array, deterministic: bool
    ) -> jax.Array:
        """Queries of `x` [B, T, d] against k, v [B, S, H, d_kv]; bias broadcasts to [B,H,T,S]."""
        q = self._heads(self.q(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        weights = jax.nn.softmax(scores + bias, axis=-1)
        weights = self.dropout(weights, deterministic=deterministic)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)
        return self.o(out.reshape(*out.shape[:2], -1))

    def __call__(
        self, x: jax.Array, kv_input: jax.Array, bias: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        k, v = self.project_kv(kv_input)
        return self.attend(x, k, v, bias, deterministic)


class T5FeedForward(nn.Module):
    """wo(act(wi x)) (v1.0) or wo(act(wi_0 x) * wi_1 x) (v1.1)."""

    config: T5Config

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        act = _ACTIVATIONS[cfg.activation]
        if cfg.is_gated:
            gate = act(_dense(cfg, "wi_0", cfg.d_ff, cfg.d_model)(x))
            h = gate * _dense(cfg, "wi_1", cfg.d_ff, cfg.d_model)(x)
        else:
            h = act(_dense(cfg, "wi", cfg.d_ff, cfg.d_model)(x))
        h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
        return _dense(cfg, "wo", cfg.d_model, cfg.d_ff)(h)


class T5Block(nn.Module):
    """Self-attention, cross-attention (decoder only) and feed-forward, each pre-normed."""

    config: T5Config
    is_decoder: bool = False

    def setup(self) -> None:
        cfg = self.config
        self.self_attn_norm = T5LayerNorm(cfg.layer_norm_epsilon)
        self.self_attn = T5Attention(cfg)
        if self.is_decoder:
            self.cross_attn_norm = T5LayerNorm(cfg.layer_norm_epsilon)
            self.cross_attn = T5Attention(cfg)
        self.ff_norm = T5LayerNorm(cfg.layer_norm_epsilon)
        self.ff = T5FeedForward(cfg)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _residual(self, x: jax.Array, update: jax.Array, deterministic: bool) -> jax.Array:
        return x + self.dropout(update, deterministic=deterministic).astype(jnp.float32)

    def _normed(self, norm: nn.Module, x: jax.Array) -> jax.Array:
        return norm(x).astype(self.config.compute_dtype)

    def _cross_and_ff(self, x, cross_k, cross_v, cross_bias, deterministic):
        if self.is_decoder:
            h = self._normed(self.cross_attn_norm, x)
            h = self.cross_attn.attend(h, cross_k, cross_v, cross_bias, deterministic)
            x = self._residual(x, h, deterministic)
        h = self.ff(self._normed(self.ff_norm, x), deterministic)
        return self._residual(x, h, deterministic)

    def __call__(
        self,
        x: jax.Array,
        self_bias: jax.Array,
        encoded: jax.Array | None,
        cross_bias: jax.Array | None,
        deterministic: bool = True,
    ) -> jax.Array:
        h = self._normed(self.self_attn_norm, x)
        x = self._residual(x, self.self_attn(h, h, self_bias, deterministic), deterministic)
        cross_k = cross_v = None
        if self.is_decoder:
            cross_k, cross_v = self.cross_attn.project_kv(encoded)
        return self._cross_and_ff(x, cross_k, cross_v, cross_bias, deterministic)

    def cross_kv(self, encoded: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.cross_attn.project_kv(encoded)

    def step(self, x, self_bias, cache_k, cache_v, index, cross_k, cross_v, cross_bias):
        """One decoder position: writes its K/V at `index` of the cache, returns x and cache.

        x and the cache have B * n rows, cross_k/cross_v [B, S, H, d_kv] and cross_bias B rows.
        """
        h = self._normed(self.self_attn_norm, x)
        cache_k, cache_v = (
            jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), index, 1)
            for cache, new in zip((cache_k, cache_v), self.self_attn.project_kv(h))
        )
        x = self._residual(x, self.self_attn.attend(h, cache_k, cache_v, self_bias, True), True)
        # Rows b*n .. b*n+n-1 are n samples of input b: they become n queries of one cross
        # attention, so the encoder keys/values are read once per input, not once per sample.
        groups = cross_k.shape[0]
        grouped = x.reshape(groups, -1, x.shape[-1])
        x = self._cross_and_ff(grouped, cross_k, cross_v, cross_bias, True).reshape(x.shape)
        return x, cache_k, cache_v


def _key_mask_bias(mask: jax.Array) -> jax.Array:
    """[B, S] 0/1 key mask -> additive [B, 1, 1, S] (0 or float32 min)."""
    return jnp.where(jnp.asarray(mask) > 0, 0.0, _NEG).astype(jnp.float32)[:, None, None, :]


class T5Stack(nn.Module):
    """Encoder or decoder: blocks sharing one relative position bias, then a final norm."""

    config: T5Config
    is_decoder: bool = False

    def setup(self) -> None:
        cfg = self.config
        n = cfg.num_decoder_layers if self.is_decoder else cfg.num_layers
        block = nn.remat(T5Block, static_argnums=(5,)) if cfg.remat else T5Block
        self.blocks = [block(cfg, self.is_decoder, name=f"block_{i}") for i in range(n)]
        self.relative_attention_bias = nn.Embed(
            cfg.relative_attention_num_buckets,
            cfg.num_heads,
            embedding_init=nn.initializers.normal(cfg.d_model**-0.5),
        )
        self.final_norm = T5LayerNorm(cfg.layer_norm_epsilon)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _buckets(self, query_len: int, key_len: int) -> np.ndarray:
        cfg = self.config
        return relative_position_buckets(
            query_len,
            key_len,
            bidirectional=not self.is_decoder,
            num_buckets=cfg.relative_attention_num_buckets,
            max_distance=cfg.relative_attention_max_distance,
        )

    def position_bias(self, buckets: jax.Array) -> jax.Array:
        """Bias [1, H, Q, K] (float32) for bucket ids [Q, K]."""
        table = self.relative_attention_bias.embedding.astype(jnp.float32)
        return jnp.transpose(jnp.take(table, buckets, axis=0), (2, 0, 1))[None]

    def __call__(self, x, mask, encoded=None, encoder_mask=None, deterministic=True):
        """Runs the stack on embeddings x [B, L, d]; mask [B, L] marks real tokens."""
        length = x.shape[1]
        bias = self.position_bias(jnp.asarray(self._buckets(length, length))) + _key_mask_bias(mask)
        cross_bias = None
        if self.is_decoder:
            causal = np.tril(np.ones((length, length), bool))
            bias = jnp.where(causal, bias, _NEG)
            cross_bias = _key_mask_bias(encoder_mask)
        x = self.dropout(x, deterministic=deterministic)
        for block in self.blocks:
            x = block(x, bias, encoded, cross_bias, deterministic)
        return self.dropout(self.final_norm(x), deterministic=deterministic)

    def cross_kv(self, encoded: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
        return [block.cross_kv(encoded) for block in self.blocks]

    def step(self, x, index, cache, cross, encoder_mask):
        """Decoder at position `index` for x [B, 1, d]; cache: per-layer (k, v) [B, T, H, d_kv]."""
        max_len = cache[0][0].shape[1]
        buckets = jnp.asarray(self._buckets(max_len, max_len))[index][None]  # [1, T]
        bias = self.position_bias(buckets)
        bias = jnp.where(jnp.arange(max_len) <= index, bias, _NEG)
        cross_bias = _key_mask_bias(encoder_mask)
        new_cache = []
        for block, (cache_k, cache_v), (cross_k, cross_v) in zip(self.blocks, cache, cross):
            x, cache_k, cache_v = block.step(
                x, bias, cache_k, cache_v, index, cross_k, cross_v, cross_bias
            )
            new_cache.append((cache_k, cache_v))
        return self.final_norm(x), new_cache


class T5(nn.Module):
    """T5ForConditionalGeneration: `__call__` returns teacher-forced logits [B, T, V] float32.

    The training path has no batch coupling (attention and norms are per example), so it can be
    vmapped over a leading per-example axis with B=1 inside.
    """

    config: T5Config

    def setup(self) -> None:
        cfg = self.config
        self.shared = TappedEmbed(
            cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(1.0)
        )
        self.encoder = T5Stack(cfg, is_decoder=False)
        self.decoder = T5Stack(cfg, is_decoder=True)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                dtype=cfg.compute_dtype,
                dot_general=functools.partial(
                    jax.lax.dot_general, preferred_element_type=jnp.float32
                ),
                kernel_init=nn.initializers.normal(1.0),
            )

    def _logits(self, h: jax.Array) -> jax.Array:
        cfg = self.config
        dt = cfg.compute_dtype
        if not cfg.tie_word_embeddings:
            return self.lm_head(h.astype(dt))
        h = (h * cfg.d_model**-0.5).astype(dt)
        return self.shared.attend(h, preferred_element_type=jnp.float32)

    def encode(self, input_ids, attention_mask, deterministic: bool = True) -> jax.Array:
        """Encoder states [B, S, d_model] (float32) of input_ids [B, S]."""
        return self.encoder(self.shared(input_ids), attention_mask, deterministic=deterministic)

    def decode(
        self,
        encoded: jax.Array,
        attention_mask: jax.Array,
        decoder_input_ids: jax.Array,
        decoder_attention_mask: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Teacher-forced logits [B, T, V] given encoder states and decoder inputs [B, T]."""
        if decoder_attention_mask is None:
            decoder_attention_mask = jnp.ones(decoder_input_ids.shape, jnp.int32)
        h = self.decoder(
            self.shared(decoder_input_ids),
            decoder_attention_mask,
            encoded.astype(self.config.compute_dtype),
            attention_mask,
            deterministic=deterministic,
        )
        return self._logits(h)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array,
        decoder_input_ids: jax.Array,
        decoder_attention_mask: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Logits [B, T, V] float32 (teacher forcing).

        Args:
          input_ids: encoder token ids [B, S].
          attention_mask: [B, S], 1 for real tokens, 0 for padding.
          decoder_input_ids: [B, T], usually `shift_right(labels, ...)`.
          decoder_attention_mask: [B, T] or None (all ones); masks padded decoder keys.
          deterministic: False enables dropout (needs a "dropout" PRNG stream).
        """
        encoded = self.encode(input_ids, attention_mask, deterministic)
        return self.decode(
            encoded, attention_mask, decoder_input_ids, decoder_attention_mask, deterministic
        )

    def cross_kv(self, encoded: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
        """Per decoder layer, cross-attention keys and values [B, S, H, d_kv] of `encoded`."""
        return self.decoder.cross_kv(encoded.astype(self.config.compute_dtype))

    def decode_step(self, token, index, cache, cross, attention_mask):
        """One decoding step with a KV cache.

        Args:
          token: int [B], the decoder input at position `index`.
          index: int32 scalar, position of `token`.
          cache: per decoder layer (k, v) [B, T_max, H, d_kv]; positions < index are filled.
          cross: `cross_kv(encoded)`, with B / n rows when the B rows are n samples of each
            input (row b * n + s is sample s of input b): encoder keys are not repeated.
          attention_mask: encoder mask [B / n, S].

        Returns:
          (logits [B, V] float32, updated cache).
        """
        x = self.shared(token)[:, None, :]
        h, cache = self.decoder.step(x, index, cache, cross, attention_mask)
        return self._logits(h)[:, 0], cache

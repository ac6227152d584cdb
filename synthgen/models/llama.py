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
* Incremental decoding with a KV cache: `synthgen.models.kv_cache` (the layers one by one,
  over per-layer parameters and cache buffers, which XLA:CPU runs without copying them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from synthgen.models.config_checks import check_config, check_divides
from synthgen.models.lora import LoraDense
from synthgen.models.taps import TAP_INPUTS, TAP_OUTPUTS, TappedEmbed

PyTree = Any

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "max_seq_len",
)
_MASKED = float(jnp.finfo(jnp.float32).min)  # finite: a fully masked row gives no NaN

# One layer's decoding cache: keys [B, K, S, D], values [B, K, S, D], the next slot (int32).
LayerCache = tuple[jax.Array, jax.Array, jax.Array]


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
        check_config(self, _POSITIVE_INTS, ("rope_theta", "rms_norm_eps"), LORA_TARGETS)
        check_divides(self, "num_kv_heads", "num_heads")
        if self.head_dim is None:
            check_divides(self, "num_heads", "hidden_size")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int, got {self.head_dim=}")

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
        mask: jax.Array,
        cache: LayerCache | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """Attends x [B, T, d] to itself, or, with a cache, to the cache after writing x's keys.

        Args:
          x: block input [B, T, d].
          cos: RoPE cosines [B, T, D].
          sin: RoPE sines [B, T, D].
          mask: bool, query t may see key s: [B, T, T] over this block without a cache,
            [B, T, S] over the cache's slots with one.
          cache: this layer's (keys [B, K, S, D], values [B, K, S, D], slot index): the
            block's rotated keys and values are written into slots index .. index + T - 1
            first, then the block attends to all S slots under `mask`.

        Returns:
          The attention output [B, T, d] and the updated cache (None without one).
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
        if cache is None:
            scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=f32)
            scores = jnp.where(mask[:, None, None], scores, _MASKED)
            probs = jax.nn.softmax(scores, axis=-1).astype(dt)
            out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=f32)
        else:
            ck, cv, index = cache
            zero = jnp.zeros((), jnp.int32)
            at = (zero, zero, index, zero)
            ck = jax.lax.dynamic_update_slice(ck, jnp.swapaxes(k, 1, 2).astype(ck.dtype), at)
            cv = jax.lax.dynamic_update_slice(cv, jnp.swapaxes(v, 1, 2).astype(cv.dtype), at)
            # Keys as the left operand, [S, D] x [D, T*G] per (row, kv head): XLA:CPU runs
            # it as one fast batched product, the other way round several times slower.
            scores = jnp.einsum("bksd,btkgd->bkstg", ck.astype(dt), q, preferred_element_type=f32)
            visible = jnp.swapaxes(mask, 1, 2)[:, None, :, :, None]  # [B, 1, S, T, 1]
            probs = jax.nn.softmax(jnp.where(visible, scores, _MASKED), axis=2).astype(dt)
            # Slots last and the output's heads before the block's tokens: this product
            # then runs as the fast kind too ([T*G, S] x [S, D]); written as one einsum to
            # "btkgd", XLA:CPU swaps the operands into a generic loop 3x slower.
            probs = jnp.transpose(probs, (0, 1, 3, 4, 2))
            out = jnp.einsum("bktgs,bksd->bktgd", probs, cv.astype(dt), preferred_element_type=f32)
            out = jnp.swapaxes(out, 1, 2)
            cache = (ck, cv, index)
        out = out.astype(dt).reshape(b, t, h * d)
        return _dense(c, c.hidden_size, "o")(out), cache


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
    """One pre-norm block; the call signature is `nn.scan`'s ``(carry, *inputs)``.

    `mask` and `cache` are `Attention`'s: without a cache (training, scoring) the block
    attends to itself; with one (`synthgen.models.kv_cache`) it returns the updated cache.
    """

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array, *inputs: Any) -> tuple[jax.Array, LayerCache | None]:
        """x [B, T, d] through the block; `inputs`: `Attention`'s cos, sin, mask and cache."""
        c = self.config
        h = _rms_norm(c, "attn_norm")(x)
        attn, cache = Attention(c, name="attn")(h, *inputs)
        x = x + attn
        x = x + Mlp(c, name="mlp")(_rms_norm(c, "mlp_norm")(x))
        return x, cache


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
            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
            length=c.num_layers,
        )(c)
        self.final_norm = _rms_norm(c, "final_norm")
        if not c.tie_word_embeddings:
            self.lm_head = LoraDense(c.vocab_size, dtype=c.jnp_dtype)

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """Token embeddings [B, T, d] in the config dtype."""
        return self.embed(input_ids.astype(jnp.int32)).astype(self.config.jnp_dtype)

    def logits(self, h: jax.Array) -> jax.Array:
        """Final norm and output projection: float32 logits [..., V] of hidden states h."""
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
        c = self.config
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        h, _ = self.layers(self.embed_tokens(input_ids), cos, sin, self_mask)
        if (window_start is None) != (window_len is None):
            raise ValueError("give both window_start and window_len, or neither")
        if window_len is not None:
            h = jax.vmap(lambda row, start: jax.lax.dynamic_slice_in_dim(row, start, window_len))(
                h, window_start.astype(jnp.int32)
            )
        return self.logits(h)


def init_params(config: LlamaConfig, key: jax.Array) -> PyTree:
    """Random parameters (for tests and from-scratch training), initialised under jit."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.jit(lambda k: Llama(config).init(k, ids)["params"])(key)

"""BERT encoder in Flax and its loading from Hugging Face safetensors (no torch).

The BERT module has no dropout, absolute positions and token type 0 only. HF tensors map to
Flax paths by name (`bert_name_map`, tabled in docs/guides/byo.md#weight-names); a ``bert.``
prefix is stripped, ``pooler.*``, ``cls.*`` and ``embeddings.position_ids`` are ignored, any
other unused tensor is an error.

References:
  Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers"; HF
  `modeling_bert.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from synthgen.models.config_checks import check_config, check_divides
from synthgen.models.safetensors_io import params_by_name, read_safetensors

PyTree = Any
_NEG = float(np.finfo(np.float32).min)  # additive mask value, as HF (no -inf: no NaN rows)
_ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}
_UNUSED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")
_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


# ---- BERT model ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """BERT encoder hyper-parameters (names and meaning as in HF `BertConfig`).

    Attributes:
      vocab_size: rows of the word embedding.
      hidden_size: width of the residual stream and of the sentence embedding.
      num_hidden_layers: transformer layers.
      num_attention_heads: heads per layer; must divide hidden_size.
      intermediate_size: inner width of the feed-forward block.
      max_position_embeddings: rows of the absolute position embedding (longest input).
      type_vocab_size: rows of the token-type embedding (only type 0 is used).
      layer_norm_eps: LayerNorm epsilon.
      hidden_act: "gelu" (exact erf GELU), "gelu_new" (tanh approximation) or "relu".
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    def __post_init__(self) -> None:
        check_config(self, _POSITIVE_INTS, ("layer_norm_eps",))
        check_divides(self, "num_attention_heads", "hidden_size")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act must be in {sorted(_ACTIVATIONS)}, {self.hidden_act=}")

    @classmethod
    def tiny(cls, **overrides: Any) -> BertConfig:
        """A 2-layer, width-64 model for tests (vocab 1024, 128 positions)."""
        fields: dict[str, Any] = dict(
            vocab_size=1024,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
        )
        return cls(**{**fields, **overrides})

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> BertConfig:
        """Reads a HF BERT `config.json` dict (missing keys take HF's defaults).

        Raises:
          ValueError: not a BERT config, or not absolute position embeddings.
        """
        if hf.get("model_type", "bert") != "bert":
            raise ValueError(f"not a BERT config, got model_type={hf.get('model_type')!r}")
        position = hf.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise ValueError(f"only absolute position embeddings are supported, {position=}")
        return cls(
            vocab_size=hf.get("vocab_size", 30522),
            hidden_size=hf.get("hidden_size", 768),
            num_hidden_layers=hf.get("num_hidden_layers", 12),
            num_attention_heads=hf.get("num_attention_heads", 12),
            intermediate_size=hf.get("intermediate_size", 3072),
            max_position_embeddings=hf.get("max_position_embeddings", 512),
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            hidden_act=hf.get("hidden_act", "gelu"),
        )


class BertLayer(nn.Module):
    """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + W2 act(W1 x))."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array, key_bias: jax.Array) -> jax.Array:
        """x [B, T, d]; key_bias [B, 1, 1, T] is 0 for real keys and float32 min for padding."""
        cfg = self.config
        heads = cfg.num_attention_heads
        width = cfg.hidden_size // heads
        dense = functools.partial(nn.Dense, kernel_init=nn.initializers.normal(0.02))
        norm = functools.partial(nn.LayerNorm, epsilon=cfg.layer_norm_eps)

        # Heads first ([B, H, T, w]), q scaled before the product, and the softmax's division
        # after the value product (on [B, H, T, w], not [B, H, T, T]): same values, about 4x
        # less attention time on CPU at T = 256 than the per-token layout.
        q, k, v = (
            dense(cfg.hidden_size, name=name)(x)
            .reshape(*x.shape[:2], heads, width)
            .transpose(0, 2, 1, 3)
            for name in ("query", "key", "value")
        )
        scores = jnp.einsum("bhqd,bhkd->bhqk", q / math.sqrt(width), k) + key_bias
        weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        context = jnp.einsum("bhqk,bhkd->bhqd", weights, v) / jnp.sum(
            weights, axis=-1, keepdims=True
        )
        attended = dense(cfg.hidden_size, name="attention_out")(
            context.transpose(0, 2, 1, 3).reshape(x.shape)
        )
        x = norm(name="attention_norm")(x + attended)
        inner = _ACTIVATIONS[cfg.hidden_act](dense(cfg.intermediate_size, name="intermediate")(x))
        return norm(name="output_norm")(x + dense(cfg.hidden_size, name="output")(inner))


class Bert(nn.Module):
    """BERT encoder (HF `BertModel` without its pooler)."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """Last hidden states [B, T, d] float32.

        Args:
          input_ids: token ids [B, T], T <= max_position_embeddings.
          attention_mask: [B, T], 1 for real tokens, 0 for padding (masked as keys).
        """
        cfg = self.config
        embed = functools.partial(
            nn.Embed, features=cfg.hidden_size, embedding_init=nn.initializers.normal(0.02)
        )
        ids = jnp.asarray(input_ids, jnp.int32)
        x = (
            embed(cfg.vocab_size, name="word_embeddings")(ids)
            + embed(cfg.max_position_embeddings, name="position_embeddings")(
                jnp.arange(ids.shape[1])
            )
            + embed(cfg.type_vocab_size, name="token_type_embeddings")(jnp.zeros_like(ids))
        )
        x = nn.LayerNorm(epsilon=cfg.layer_norm_eps, name="embeddings_norm")(x)
        key_bias = jnp.where(jnp.asarray(attention_mask) > 0, 0.0, _NEG)[:, None, None, :]
        for i in range(cfg.num_hidden_layers):
            x = BertLayer(cfg, name=f"layer_{i}")(x, key_bias)
        return x


def bert_name_map(config: BertConfig) -> dict[tuple[str, ...], tuple[str, bool]]:
    """Flax parameter path -> (HF tensor name without prefix, transpose?) for every weight."""
    names: dict[tuple[str, ...], tuple[str, bool]] = {}
    for table in ("word", "position", "token_type"):
        names[(f"{table}_embeddings", "embedding")] = (
            f"embeddings.{table}_embeddings.weight",
            False,
        )

    def linear(path: tuple[str, ...], hf: str) -> None:
        names[(*path, "kernel")] = (f"{hf}.weight", True)
        names[(*path, "bias")] = (f"{hf}.bias", False)

    def layer_norm(path: tuple[str, ...], hf: str) -> None:
        names[(*path, "scale")] = (f"{hf}.weight", False)
        names[(*path, "bias")] = (f"{hf}.bias", False)

    layer_norm(("embeddings_norm",), "embeddings.LayerNorm")
    for i in range(config.num_hidden_layers):
        ours, hf = f"layer_{i}", f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            linear((ours, proj), f"{hf}.attention.self.{proj}")
        linear((ours, "attention_out"), f"{hf}.attention.output.dense")
        layer_norm((ours, "attention_norm"), f"{hf}.attention.output.LayerNorm")
        linear((ours, "intermediate"), f"{hf}.intermediate.dense")
        linear((ours, "output"), f"{hf}.output.dense")
        layer_norm((ours, "output_norm"), f"{hf}.output.LayerNorm")
    return names


def read_hf_tensors(path: Path) -> dict[str, np.ndarray]:
    """Tensors of a folder's model.safetensors (or sharded index), LayerNorm names normalised."""
    tensors: dict[str, np.ndarray] = {}
    for name, tensor in read_safetensors(path).items():
        # Old TF conversions name the LayerNorm parameters gamma and beta.
        key = name.replace("LayerNorm.gamma", "LayerNorm.weight")
        tensors[key.replace("LayerNorm.beta", "LayerNorm.bias")] = tensor
    return tensors


def bert_params_from_hf(config: BertConfig, tensors: dict[str, np.ndarray]) -> PyTree:
    """Flax params of `Bert(config)` from HF-named tensors (``bert.`` prefix optional).

    Raises:
      ValueError: a missing, unused or mis-shaped tensor (named in the message).
    """
    tensors = {k.removeprefix("bert."): v for k, v in tensors.items()}
    tensors = {k: v for k, v in tensors.items() if not k.startswith(_UNUSED_PREFIXES)}
    ids = np.zeros((1, 2), np.int32)
    shapes = jax.eval_shape(lambda: Bert(config).init(jax.random.key(0), ids, ids + 1))
    return params_by_name(bert_name_map(config), shapes["params"], tensors, "BERT", "checkpoint")

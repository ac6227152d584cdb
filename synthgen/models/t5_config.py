"""T5 hyper-parameters: `T5Config`, its presets and the Hugging Face `config.json` mapping.

Presets: "tiny" (tests), "small"/"base"/"large" (T5 v1.0: ReLU, tied head) and
"v1_1-small"/"v1_1-base"/"v1_1-large" (T5 v1.1: gated-GELU, untied head), with the sizes of
the published checkpoints (t5-small: 60,506,624 parameters).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from synthgen.models.config_checks import check_config

ACTIVATION_NAMES = ("relu", "gelu", "gelu_new", "silu")
LORA_TARGET_NAMES = ("q", "k", "v", "o", "wi", "wo")
# The size fields, each a positive int (checked; also the first keys of `config.json`).
_POSITIVE_INTS = (
    "vocab_size",
    "d_model",
    "d_kv",
    "d_ff",
    "num_layers",
    "num_decoder_layers",
    "num_heads",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
)
# The `config.json` keys read and written as they are.
_HF_KEYS = (
    *_POSITIVE_INTS,
    "layer_norm_epsilon",
    "feed_forward_proj",
    "tie_word_embeddings",
    "dropout_rate",
    "pad_token_id",
    "eos_token_id",
    "decoder_start_token_id",
)

_V1_0 = dict(vocab_size=32128, d_kv=64, feed_forward_proj="relu", tie_word_embeddings=True)
_V1_1 = dict(vocab_size=32128, d_kv=64, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                 num_decoder_layers=2, num_heads=4),
    "small": dict(_V1_0, d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8),
    "base": dict(_V1_0, d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12,
                 num_heads=12),
    "large": dict(_V1_0, d_model=1024, d_ff=4096, num_layers=24, num_decoder_layers=24,
                  num_heads=16),
    "v1_1-small": dict(_V1_1, d_model=512, d_ff=1024, num_layers=8, num_decoder_layers=8,
                       num_heads=6),
    "v1_1-base": dict(_V1_1, d_model=768, d_ff=2048, num_layers=12, num_decoder_layers=12,
                      num_heads=12),
    "v1_1-large": dict(_V1_1, d_model=1024, d_ff=2816, num_layers=24, num_decoder_layers=24,
                       num_heads=16),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class T5Config:
    """T5 hyper-parameters (names and meaning as in HF `T5Config`).

    Attributes:
      vocab_size: rows of the shared embedding (and of the LM head).
      d_model: width of the residual stream.
      d_kv: width of one attention head.
      d_ff: inner width of the feed-forward block.
      num_layers: encoder blocks.
      num_decoder_layers: decoder blocks.
      num_heads: attention heads.
      relative_attention_num_buckets: buckets of the relative position bias.
      relative_attention_max_distance: distance beyond which positions share the last bucket.
      layer_norm_epsilon: RMS norm epsilon.
      feed_forward_proj: "relu" (v1.0) or "gated-gelu" (v1.1); also "gelu", "silu" and their
        "gated-" forms, as HF parses them.
      tie_word_embeddings: LM head = shared embedding, decoder output scaled by d_model**-0.5
        (v1.0); False: separate `lm_head` and no scaling (v1.1).
      dropout_rate: dropout, active only when called with `deterministic=False`.
      pad_token_id: padding id.
      eos_token_id: end-of-sequence id.
      decoder_start_token_id: first decoder input (T5: the pad id).
      lora_rank: rank of the LoRA adapters; 0 disables them.
      lora_alpha: LoRA scale numerator (the update is alpha / rank * x A B).
      lora_targets: projections that get adapters, among q, k, v, o, wi, wo ("wi" covers
        wi_0 and wi_1 of gated feed-forwards).
      dtype: compute dtype of matmuls ("float32" or "bfloat16"); parameters stay float32.
      remat: rematerialise each block in the backward pass (less memory, more compute).
    """

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    dropout_rate: float = 0.0
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q", "v")
    dtype: str = "float32"
    remat: bool = False

    def __post_init__(self) -> None:
        check_config(self, _POSITIVE_INTS, ("layer_norm_epsilon",), LORA_TARGET_NAMES)
        if self.relative_attention_num_buckets < 4:
            raise ValueError(f"need >= 4 buckets, got {self.relative_attention_num_buckets=}")
        parts = self.feed_forward_proj.split("-")
        if (
            len(parts) > 2
            or (len(parts) == 2 and parts[0] != "gated")
            or (self.activation not in ACTIVATION_NAMES)
        ):
            raise ValueError(f"unsupported feed_forward_proj, got {self.feed_forward_proj=}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate=}")
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be a token id < vocab_size, got {value=}")

    @property
    def is_gated(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def activation(self) -> str:
        """HF `dense_act_fn`: "gated-gelu" means the tanh approximation ("gelu_new")."""
        if self.feed_forward_proj == "gated-gelu":
            return "gelu_new"
        return self.feed_forward_proj.split("-")[-1]

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> T5Config:
        """Named sizes: tiny (tests), small/base/large (v1.0), v1_1-small/base/large.

        Args:
          name: preset name.
          **overrides: fields to replace (e.g. vocab_size, lora_rank).

        Raises:
          ValueError: unknown preset.
        """
        if name not in _PRESETS:
            raise ValueError(f"unknown T5 preset, expected one of {sorted(_PRESETS)}, {name=}")
        return cls(**{**_PRESETS[name], **overrides})

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> T5Config:
        """Reads a Hugging Face `config.json` dict (missing keys take HF's defaults).

        HF >= 5 writes `tie_word_embeddings: true` for every T5 and keeps the v1.1 behaviour in
        `scale_decoder_outputs: false`; that combination is read as an untied (v1.1) model.
        """
        if hf.get("model_type", "t5") not in ("t5", "mt5"):
            raise ValueError(f"not a T5 config, got model_type={hf.get('model_type')!r}")
        # HF's defaults: t5-small's sizes, this class's defaults, but dropout 0.1.
        fields = {**_PRESETS["small"], "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6}
        fields.update({key: hf[key] for key in _HF_KEYS if key in hf})
        eos = fields.get("eos_token_id", 1)
        fields.update(
            num_decoder_layers=hf.get("num_decoder_layers") or fields["num_layers"],
            layer_norm_epsilon=float(fields["layer_norm_epsilon"]),
            dropout_rate=float(fields["dropout_rate"]),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            tie_word_embeddings=bool(fields["tie_word_embeddings"])
            and hf.get("scale_decoder_outputs") is not False,
        )
        return cls(**{**fields, **overrides})

    def to_hf_config(self) -> dict[str, Any]:
        """The `config.json` dict HF `T5ForConditionalGeneration` reads."""
        return {
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "is_encoder_decoder": True,
            **{key: getattr(self, key) for key in _HF_KEYS},
            "initializer_factor": 1.0,
        }

    def lora_rank_for(self, name: str) -> int:
        """Adapter rank of projection `name` (wi_0/wi_1 count as wi)."""
        base = "wi" if name.startswith("wi") else name
        return self.lora_rank if base in self.lora_targets else 0

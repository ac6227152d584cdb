"""Loads T5 from the Hugging Face directory format (config.json + safetensors).

The name map is exact: every weight the Flax model needs must be in the checkpoint and every
tensor in the checkpoint must be used, except the aliases HF itself ignores
(`encoder.embed_tokens`, `decoder.embed_tokens`, a tied `lm_head`, and the unused
`decoder.block.0.layer.1.EncDecAttention.relative_attention_bias` of the original
checkpoints). PyTorch `nn.Linear` weights are [out, in]; Flax kernels are [in, out], so every
projection is transposed. Weights are loaded as float32 whatever their stored dtype.

The name map (`hf_name_map`) is tabled in docs/guides/byo.md#weight-names.

An untied (v1.1) config whose checkpoint has no `lm_head.weight` takes the shared embedding as
its head, as HF >= 5 does (it writes such checkpoints for freshly initialised v1.1 models).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from synthgen.models.lora import is_lora_path
from synthgen.models.safetensors_io import params_by_name, read_safetensors
from synthgen.models.t5 import T5, T5Config
from synthgen.models.tokenizer import Tokenizer

PyTree = Any
Path_ = tuple[str, ...]

_IGNORED = (
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
)


def hf_name_map(config: T5Config) -> dict[Path_, tuple[str, bool]]:
    """Flax parameter path -> (HF tensor name, transpose?) for every base (non-LoRA) weight."""
    names: dict[Path_, tuple[str, bool]] = {("shared", "embedding"): ("shared.weight", False)}
    ff = ("wi_0", "wi_1", "wo") if config.is_gated else ("wi", "wo")
    for stack, depth in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        names[(stack, "relative_attention_bias", "embedding")] = (
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            False,
        )
        names[(stack, "final_norm", "scale")] = (f"{stack}.final_layer_norm.weight", False)
        for i in range(depth):
            block, hf = (stack, f"block_{i}"), f"{stack}.block.{i}.layer"
            parts = [("self_attn", 0, "SelfAttention")]
            if stack == "decoder":
                parts.append(("cross_attn", 1, "EncDecAttention"))
            for flax_name, layer, hf_name in parts:
                names[(*block, f"{flax_name}_norm", "scale")] = (
                    f"{hf}.{layer}.layer_norm.weight",
                    False,
                )
                for proj in ("q", "k", "v", "o"):
                    names[(*block, flax_name, proj, "kernel")] = (
                        f"{hf}.{layer}.{hf_name}.{proj}.weight",
                        True,
                    )
            f = len(parts)
            names[(*block, "ff_norm", "scale")] = (f"{hf}.{f}.layer_norm.weight", False)
            for proj in ff:
                names[(*block, "ff", proj, "kernel")] = (
                    f"{hf}.{f}.DenseReluDense.{proj}.weight",
                    True,
                )
    if not config.tie_word_embeddings:
        names[("lm_head", "kernel")] = ("lm_head.weight", True)
    return names


def _resolve_aliases(config: T5Config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` without the aliases HF writes or ignores (checked equal where they must be)."""
    tensors = dict(tensors)
    shared = tensors.get("shared.weight")
    if shared is None:  # some exports keep only the stack copies of the embedding
        shared = tensors.get("encoder.embed_tokens.weight")
        if shared is not None:
            tensors["shared.weight"] = shared
    if not config.tie_word_embeddings and "lm_head.weight" not in tensors and shared is not None:
        # HF >= 5 ties lm_head to shared when the checkpoint has no separate head.
        tensors["lm_head.weight"] = shared
    if config.tie_word_embeddings and "lm_head.weight" in tensors:
        if not np.array_equal(tensors.pop("lm_head.weight"), shared):
            raise ValueError(
                "config says tie_word_embeddings but lm_head.weight differs from "
                "shared.weight; set tie_word_embeddings=false in config.json"
            )
    for alias in _IGNORED[:2]:
        if alias in tensors and not np.array_equal(tensors.pop(alias), shared):
            raise ValueError(
                f"{alias} differs from shared.weight; untied input embeddings are not supported"
            )
    tensors.pop(_IGNORED[2], None)
    return tensors


def params_from_hf(
    config: T5Config, tensors: dict[str, np.ndarray], *, lora_key: jax.Array | None = None
) -> PyTree:
    """Flax params of `config` from HF-named tensors; LoRA adapters are freshly initialised.

    Args:
      config: the model configuration (with `lora_rank` > 0 for adapters).
      tensors: HF name -> array (any float dtype).
      lora_key: PRNG key for the adapters' A matrices (B starts at zero, so the model's
        output is unchanged); default `jax.random.key(0)`.

    Raises:
      ValueError: missing, unused or mis-shaped tensors.
    """
    ids = np.zeros((1, 2), np.int32)
    shapes = jax.eval_shape(lambda: T5(config).init(jax.random.key(0), ids, ids + 1, ids))
    expected = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(shapes["params"]).items()}
    names = hf_name_map(config)
    unnamed = [p for p in expected if p not in names and not is_lora_path(p)]
    if unnamed:
        raise ValueError(f"no checkpoint weight for parameter {'/'.join(unnamed[0])}")
    tensors = _resolve_aliases(config, tensors)
    base = params_by_name(names, shapes["params"], tensors, "T5", "checkpoint")
    flat = traverse_util.flatten_dict(base)
    key = jax.random.key(0) if lora_key is None else lora_key
    lora_paths = sorted(p for p in expected if is_lora_path(p))
    for i, path in enumerate(lora_paths):
        shape = expected[path]
        if path[-1] == "lora_b":
            flat[path] = np.zeros(shape, np.float32)
        else:  # as LoraDense's init: N(0, 1/in)
            noise = jax.random.normal(jax.random.fold_in(key, i), shape, np.float32)
            flat[path] = np.asarray(noise) * shape[0] ** -0.5
    return traverse_util.unflatten_dict({k: jax.numpy.asarray(v) for k, v in flat.items()})


def load_t5(
    path: str | Path,
    *,
    lora_rank: int = 0,
    lora_alpha: float = 16.0,
    lora_targets: tuple[str, ...] | None = None,
    dtype: str = "float32",
    lora_key: jax.Array | None = None,
    require_tokenizer: bool = True,
) -> tuple[T5Config, PyTree, Tokenizer | None]:
    """Loads a Hugging Face T5 directory.

    Args:
      path: directory with config.json, model.safetensors (or a sharded index) and
        spiece.model or tokenizer.json.
      lora_rank: adapter rank (0: none).
      lora_alpha: adapter scale numerator.
      lora_targets: projections with adapters (default: the config default, q and v).
      dtype: compute dtype of the model ("float32" or "bfloat16"); params are float32.
      lora_key: PRNG key for the adapters' initialisation (default `jax.random.key(0)`).
      require_tokenizer: raise if the directory has no tokenizer (else return None).

    Returns:
      (config, params, tokenizer).

    Raises:
      FileNotFoundError: no config.json, weights or (when required) tokenizer.
      ValueError: the weights do not match the config exactly.
    """
    from synthgen.models.sentencepiece_tokenizer import load_tokenizer

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"no config.json in {path} (expected a Hugging Face T5 folder)")
    overrides: dict[str, Any] = dict(lora_rank=lora_rank, lora_alpha=lora_alpha, dtype=dtype)
    if lora_targets is not None:
        overrides["lora_targets"] = tuple(lora_targets)
    config = T5Config.from_hf_config(json.loads(config_file.read_text()), **overrides)
    params = params_from_hf(config, read_safetensors(path, np.float32), lora_key=lora_key)
    tokenizer = load_tokenizer(path, required=require_tokenizer)
    return config, params, tokenizer

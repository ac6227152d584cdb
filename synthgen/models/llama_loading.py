"""Loads Llama-architecture weights into `synthgen.models.llama` parameters.

Sources:

* an asset name (``"smollm2-135m-instruct"``, resolved offline by `synthgen.assets`);
* a llama.cpp ``.gguf`` file: hyper-parameters from the ``llama.*`` metadata, tensors
  dequantised with `gguf.quants.dequantize` (Q4_1, Q8_0, F16, ...) and kept as float32
  (or the config dtype), the tokenizer and chat template from ``tokenizer.*``; a fetched
  asset's file is read once per machine (`converted_weights`);
* a Hugging Face folder: config.json + model.safetensors (or sharded ``*.safetensors``),
  and tokenizer.json when present.

llama.cpp's converter (convert_hf_to_gguf.py, ``LlamaModel.permute``) reorders the output rows
of q_proj and k_proj so that each head's rotary pairs are interleaved (GPT-J layout, which
ggml's rope expects). This model uses the Hugging Face ``rotate_half`` layout, so
`unpermute_rotary` undoes that reordering exactly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from synthgen import assets
from synthgen.models import converted_weights
from synthgen.models.bpe_tokenizer import BpeTokenizer
from synthgen.models.llama import Llama, LlamaConfig
from synthgen.models.lora import LORA_NAMES

PyTree = Any

# (our module path, HF weight suffix, llama.cpp tensor suffix) of every per-layer weight.
_LAYER_WEIGHTS = (
    (("attn_norm", "scale"), "input_layernorm.weight", "attn_norm.weight"),
    (("attn", "q", "kernel"), "self_attn.q_proj.weight", "attn_q.weight"),
    (("attn", "k", "kernel"), "self_attn.k_proj.weight", "attn_k.weight"),
    (("attn", "v", "kernel"), "self_attn.v_proj.weight", "attn_v.weight"),
    (("attn", "o", "kernel"), "self_attn.o_proj.weight", "attn_output.weight"),
    (("mlp_norm", "scale"), "post_attention_layernorm.weight", "ffn_norm.weight"),
    (("mlp", "gate", "kernel"), "mlp.gate_proj.weight", "ffn_gate.weight"),
    (("mlp", "up", "kernel"), "mlp.up_proj.weight", "ffn_up.weight"),
    (("mlp", "down", "kernel"), "mlp.down_proj.weight", "ffn_down.weight"),
)


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` on a q/k projection weight [out, in].

    llama.cpp maps HF row ``h*D + i*(D/2) + j`` (half i, pair j) to ``h*D + 2*j + i``;
    this maps it back. `num_heads` is the number of heads of that projection (the kv heads
    for k).
    """
    out = weight.shape[0]
    if out % (2 * num_heads):
        raise ValueError(f"rows not divisible by 2 * heads: {weight.shape=} {num_heads=}")
    return (
        weight.reshape(num_heads, out // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def load_llama(
    name_or_path: str | Path,
    *,
    lora_rank: int = 0,
    lora_alpha: float = 16.0,
    lora_targets: Sequence[str] = ("q", "v"),
    dtype: str = "float32",
    max_seq_len: int | None = None,
    key: jax.Array | None = None,
) -> tuple[LlamaConfig, PyTree, BpeTokenizer | None]:
    """Loads a Llama-architecture model and its tokenizer.

    Args:
      name_or_path: an asset name, a .gguf file or a Hugging Face folder.
      lora_rank: LoRA rank; > 0 adds fresh adapters (B = 0, so the model is unchanged).
      lora_alpha: LoRA scale numerator.
      lora_targets: projections that get adapters.
      dtype: parameter and computation dtype ("float32", "bfloat16", "float16").
      max_seq_len: override of the context length recorded in the file.
      key: PRNG key for the LoRA A matrices; None means ``jax.random.key(0)`` (A's
        initialisation is public randomness; pass a key to vary it).

    Returns:
      (config, params, tokenizer); tokenizer is None when the source holds none.

    Raises:
      ValueError: unknown source, unsupported architecture or mismatched weights.
      AssetError: an asset name that is not cached and cannot be fetched.
    """
    source = Path(name_or_path)
    if str(name_or_path) in assets.REGISTRY:
        source = Path(assets.resolve(str(name_or_path)))
    if source.is_file() and source.suffix == ".gguf":
        config, tensors, tokenizer = _read_gguf_once(source)
    elif source.is_dir() and (source / "config.json").is_file():
        config, tensors, tokenizer = _read_hf_dir(source)
    else:
        raise ValueError(
            "expected an asset name, a .gguf file or a folder with config.json, got "
            f"{name_or_path=}"
        )
    overrides = dict(
        lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=tuple(lora_targets), dtype=dtype
    )
    if max_seq_len is not None:
        overrides["max_seq_len"] = max_seq_len
    config = LlamaConfig(**{**config, **overrides})
    params = _assemble(config, tensors)
    if lora_rank > 0:
        params = add_lora_params(config, params, jax.random.key(0) if key is None else key)
    return config, params, tokenizer


def add_lora_params(config: LlamaConfig, params: PyTree, key: jax.Array) -> PyTree:
    """Adds fresh LoRA adapters (A ~ N(0, 1/in), B = 0) to pretrained `params`."""
    flat = traverse_util.flatten_dict(params)
    for i, (path, spec) in enumerate(sorted(_param_shapes(config).items())):
        if path[-1] not in LORA_NAMES:
            continue
        if path[-1] == "lora_b":
            flat[path] = jnp.zeros(spec.shape, spec.dtype)
        else:  # [L, in, r]
            std = spec.shape[-2] ** -0.5
            flat[path] = std * jax.random.normal(jax.random.fold_in(key, i), spec.shape)
    return traverse_util.unflatten_dict(flat)


# ---- assembling -------------------------------------------------------------------------


def _assemble(config: LlamaConfig, get: Callable[[str], np.ndarray]) -> PyTree:
    """Builds the parameter tree from HF-named, HF-layout ([out, in]) weights."""
    n = config.num_layers
    dtype = config.jnp_dtype

    def as_param(a: np.ndarray) -> jax.Array:
        return jnp.asarray(a, dtype)

    layers: dict[tuple[str, ...], jax.Array] = {}
    for path, hf, _ in _LAYER_WEIGHTS:
        first = get(f"model.layers.0.{hf}")
        shape = first.shape if first.ndim == 1 else first.shape[::-1]
        stacked = np.empty((n, *shape), np.float32)
        for i in range(n):
            w = first if i == 0 else get(f"model.layers.{i}.{hf}")
            stacked[i] = w if w.ndim == 1 else w.T
        layers[path] = as_param(stacked)
    flat = {("layers", *path): value for path, value in layers.items()}
    flat[("embed", "embedding")] = as_param(get("model.embed_tokens.weight"))
    flat[("final_norm", "scale")] = as_param(get("model.norm.weight"))
    if not config.tie_word_embeddings:
        flat[("lm_head", "kernel")] = as_param(get("lm_head.weight").T)
    params = traverse_util.unflatten_dict(flat)
    _check_shapes(config, params)
    return params


def _param_shapes(config: LlamaConfig) -> dict[tuple[str, ...], jax.ShapeDtypeStruct]:
    """Every parameter's path and shape (`Llama.init` traced abstractly: no random init)."""
    ids = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: Llama(config).init(jax.random.key(0), ids)["params"])
    return traverse_util.flatten_dict(shapes)


def _check_shapes(config: LlamaConfig, params: PyTree) -> None:
    base = _param_shapes(dataclasses.replace(config, lora_rank=0))
    want = {k: v.shape for k, v in base.items()}
    got = {k: v.shape for k, v in traverse_util.flatten_dict(params).items()}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:4]
        raise ValueError(f"weights do not match the config (first differences: {diff=})")


# ---- GGUF -------------------------------------------------------------------------------


def _hf_names(config: dict) -> list[str]:
    """Hugging Face names of every tensor of a model with these hyper-parameters."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config["tie_word_embeddings"]:
        names.append("lm_head.weight")
    for i in range(config["num_layers"]):
        names += [f"model.layers.{i}.{hf}" for _, hf, _ in _LAYER_WEIGHTS]
    return names


def _read_gguf_once(path: Path) -> tuple[dict, Callable[[str], np.ndarray], BpeTokenizer | None]:
    """`_read_gguf` through the machine-wide cache of `converted_weights` (parsed once).

    Only files inside the toolkit's cache (fetched assets) are converted: a user's own file
    is read each time, so no copy of it is left behind.
    """
    if not converted_weights.applies_to(path):
        return _read_gguf(path)
    folder = converted_weights.converted_folder(path)
    cached = converted_weights.load(folder, _hf_names)
    if cached is not None:
        return cached
    config, get, tokenizer = _read_gguf(path)
    if converted_weights.save(folder, config, get, _hf_names(config), tokenizer):
        cached = converted_weights.load(folder, _hf_names)
    return cached if cached is not None else (config, get, tokenizer)


def _read_gguf(path: Path) -> tuple[dict, Callable[[str], np.ndarray], BpeTokenizer | None]:
    # What this returns is what `converted_weights` stores for a fetched asset: a change to
    # it must bump `converted_weights.FORMAT`, or cached assets keep the old conversion.
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = reader.fields

    def meta(key: str, default: Any = None) -> Any:
        field = fields.get(key)
        return default if field is None else field.contents()

    arch = meta("general.architecture")
    if arch != "llama":
        raise ValueError(f"only the 'llama' GGUF architecture is supported, got {arch=}")
    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors or meta("llama.rope.scaling.type", "none") != "none":
        raise ValueError(f"RoPE scaling is not supported ({path.name})")
    heads = int(meta("llama.attention.head_count"))
    kv_heads = int(meta("llama.attention.head_count_kv", heads))
    hidden = int(meta("llama.embedding_length"))
    head_dim = int(meta("llama.attention.key_length", meta("llama.rope.dimension_count", 0)))
    vocab = meta("llama.vocab_size")
    if vocab is None:
        vocab = int(tensors["token_embd.weight"].shape[-1])
    config = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta("llama.feed_forward_length")),
        num_layers=int(meta("llama.block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim or hidden // heads,
        rope_theta=float(meta("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_seq_len=int(meta("llama.context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
    )
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(config["num_layers"]):
        for _, hf, cpp in _LAYER_WEIGHTS:
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{cpp}"

    def get(hf_name: str) -> np.ndarray:
        cpp = names.get(hf_name)
        if cpp not in tensors:
            raise ValueError(f"GGUF file lacks a tensor: {hf_name=} ({cpp=})")
        t = tensors[cpp]
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        data = data.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
        if cpp.endswith("attn_q.weight"):
            data = unpermute_rotary(data, heads)
        elif cpp.endswith("attn_k.weight"):
            data = unpermute_rotary(data, kv_heads)
        return data

    tokenizer = BpeTokenizer.from_gguf(reader) if "tokenizer.ggml.model" in fields else None
    return config, get, tokenizer


# ---- Hugging Face folder ----------------------------------------------------------------


def _read_hf_dir(directory: Path) -> tuple[dict, Callable[[str], np.ndarray], BpeTokenizer | None]:
    from safetensors import safe_open

    hf = json.loads((directory / "config.json").read_text())
    if hf.get("model_type", "llama") != "llama":
        raise ValueError(f"not a Llama model: {hf.get('model_type')=} in {directory}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("attention or MLP biases are not supported (attention_bias/mlp_bias)")
    rope = hf.get("rope_parameters") or {}  # transformers >= 5
    scaling = hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise ValueError(f"RoPE scaling is not supported, got {rope_type=}")
    heads = hf["num_attention_heads"]
    config = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="flax") as f:
            where.update({name: file for name in f.keys()})

    def get(name: str) -> np.ndarray:
        if name not in where:
            raise ValueError(f"safetensors lack a weight: {name=} in {directory}")
        with safe_open(str(where[name]), framework="flax") as f:  # handles bf16 too
            return np.asarray(f.get_tensor(name), np.float32)

    tokenizer = None
    if (directory / "tokenizer.json").is_file():
        tokenizer = BpeTokenizer.from_pretrained_dir(directory)
    return config, get, tokenizer

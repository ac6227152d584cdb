"""Writes the Llama parity fixture (tests/fixtures/llama_tiny/) with the reference implementation.

Run once, with a Python that has torch and transformers (tests never need them):

    python scripts/make_llama_fixture.py [--out tests/fixtures/llama_tiny]

It builds a tiny random `transformers.LlamaForCausalLM` from a fixed seed (vocab 128, hidden
32, 2 layers, 4 heads, 2 kv heads, intermediate 64, untied embeddings, rope_theta 10000: the
brief's vocab 256 / hidden 64 / intermediate 128 would make two copies of the weights about
850 KB, over the fixture budget), saves it in Hugging Face format (config.json +
model.safetensors, float32), saves the reference logits of a few input sequences to
expected.npz, and writes the same weights as a llama.cpp GGUF (model.gguf, F32 tensors,
llama.cpp tensor names, q/k rows permuted exactly as llama.cpp's convert_hf_to_gguf.py does),
so a test can prove that the GGUF loader's un-permutation is exact.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used, so tests can import `permute` without torch
    import transformers

SEED = 1234
SHAPE = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
SEQ_A = [5, 17, 99, 3, 64, 127, 0, 42, 8]
SEQ_B = [77, 1, 23, 56, 110]


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute`, verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def build_model() -> transformers.LlamaForCausalLM:
    import torch
    import transformers

    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(**SHAPE, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # RMSNorm weights: around 1, not exactly 1, so their mapping counts
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:  # O(1) activations and peaked attention, so errors would show
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model


def logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import torch

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def write_gguf(model: transformers.LlamaForCausalLM, path: Path) -> None:
    import gguf

    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llama-tiny-fixture")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(SHAPE["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        hf, blk = f"model.layers.{i}.", f"blk.{i}."
        writer.add_tensor(blk + "attn_norm.weight", sd[hf + "input_layernorm.weight"])
        q = permute(sd[hf + "self_attn.q_proj.weight"], n_head, n_head)
        k = permute(sd[hf + "self_attn.k_proj.weight"], n_head, n_kv)
        writer.add_tensor(blk + "attn_q.weight", np.ascontiguousarray(q))
        writer.add_tensor(blk + "attn_k.weight", np.ascontiguousarray(k))
        writer.add_tensor(blk + "attn_v.weight", sd[hf + "self_attn.v_proj.weight"])
        writer.add_tensor(blk + "attn_output.weight", sd[hf + "self_attn.o_proj.weight"])
        writer.add_tensor(blk + "ffn_norm.weight", sd[hf + "post_attention_layernorm.weight"])
        writer.add_tensor(blk + "ffn_gate.weight", sd[hf + "mlp.gate_proj.weight"])
        writer.add_tensor(blk + "ffn_up.weight", sd[hf + "mlp.up_proj.weight"])
        writer.add_tensor(blk + "ffn_down.weight", sd[hf + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    writer.add_tensor("output.weight", sd["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/llama_tiny"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    model = build_model()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((out / "config.json").read_text())
    config.pop("transformers_version", None)  # keep the fixture stable across versions
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    a = np.array([SEQ_A], np.int32)
    b = np.array([SEQ_B], np.int32)
    t = len(SEQ_A)
    pad = t - len(SEQ_B)
    right_ids = np.array([SEQ_A, SEQ_B + [0] * pad], np.int32)
    right_mask = np.array([[1] * t, [1] * len(SEQ_B) + [0] * pad], np.int32)
    left_ids = np.array([SEQ_A, [0] * pad + SEQ_B], np.int32)
    left_mask = np.array([[1] * t, [0] * pad + [1] * len(SEQ_B)], np.int32)
    np.savez_compressed(
        out / "expected.npz",
        ids_a=a,
        logits_a=logits(model, a, np.ones_like(a)),
        ids_b=b,
        logits_b=logits(model, b, np.ones_like(b)),
        right_ids=right_ids,
        right_mask=right_mask,
        right_logits=logits(model, right_ids, right_mask),
        left_ids=left_ids,
        left_mask=left_mask,
        left_logits=logits(model, left_ids, left_mask),
    )
    write_gguf(model, out / "model.gguf")
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total / 1024:.0f} KB): {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()

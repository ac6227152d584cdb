"""Builds the T5 parity fixtures with Hugging Face transformers (run once, needs torch).

Writes tests/fixtures/t5_tiny_v1_0/ (ReLU, tied head, 2 encoder + 3 decoder layers) and
tests/fixtures/t5_tiny_v1_1/ (gated-GELU, untied head, 2 + 2 layers), each a Hugging Face
directory (config.json, model.safetensors in float32) plus expected.npz with:

* batch{0,1}_{input_ids,attention_mask,decoder_input_ids,decoder_attention_mask,logits}:
  teacher-forced logits of two padded batches (computed by reloading the saved directory with
  `T5ForConditionalGeneration.from_pretrained`, eager attention, float32);
* greedy_{input_ids,attention_mask,ids}: HF `generate(do_sample=False)` output without the
  start token, padded with the pad id to `max_new_tokens`;
* buckets_{bidirectional,causal}: HF relative position buckets for key - query in
  [-300, 300].

Sizes are smaller than a real T5 (d_model 32, 4 heads of width 4, so q/k/v/o and wi/wo are
not square and a missed transpose fails on shapes) to keep both fixtures near 300 KB; layer
norm scales and the relative attention bias are randomised so that a mix-up between any two
of them changes the logits.

Usage: /tmp/refvenv/bin/python scripts/make_t5_fixture.py [--out tests/fixtures]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers.models.t5.modeling_t5 import T5Attention

COMMON = dict(
    vocab_size=128,
    d_model=32,
    d_kv=4,
    num_heads=4,
    dropout_rate=0.0,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    layer_norm_epsilon=1e-6,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)
VARIANTS = {
    "t5_tiny_v1_0": dict(
        COMMON,
        d_ff=24,
        num_layers=2,
        num_decoder_layers=3,
        feed_forward_proj="relu",
        tie_word_embeddings=True,
        seed=1234,
    ),
    "t5_tiny_v1_1": dict(
        COMMON,
        d_ff=20,
        num_layers=2,
        num_decoder_layers=2,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        seed=5678,
    ),
}
MAX_NEW_TOKENS = 10
EOS_BOOST = 2.0


def _batches(vocab: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Two batches with right padding in the encoder and the decoder inputs."""
    out = []
    for batch, src_len, tgt_len, src_lens, tgt_lens in (
        (2, 7, 5, (7, 4), (5, 3)),
        (2, 20, 18, (20, 11), (18, 9)),
    ):
        ids = rng.integers(2, vocab, (batch, src_len))
        mask = (np.arange(src_len)[None] < np.array(src_lens)[:, None]).astype(np.int64)
        ids = np.where(mask > 0, ids, 0)
        dec = rng.integers(2, vocab, (batch, tgt_len))
        dec[:, 0] = 0  # decoder start token
        dec_mask = (np.arange(tgt_len)[None] < np.array(tgt_lens)[:, None]).astype(np.int64)
        dec = np.where(dec_mask > 0, dec, 0)
        out.append(
            dict(
                input_ids=ids,
                attention_mask=mask,
                decoder_input_ids=dec,
                decoder_attention_mask=dec_mask,
            )
        )
    return out


def _greedy(model, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HF greedy ids [B, MAX_NEW_TOKENS] (start token dropped, pad-filled) and per-row margin.

    The margin is the smallest top-1 minus top-2 score over the steps where the row had not
    finished (finished rows are forced to pad), so float noise cannot flip those choices.
    """
    gen = model.generate(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        do_sample=False,
        num_beams=1,
        max_new_tokens=MAX_NEW_TOKENS,
        use_cache=False,  # HF 5.x sizes its cache by the encoder depth
        output_scores=True,
        return_dict_in_generate=True,
    )
    seqs = gen.sequences.numpy()[:, 1:]
    steps = seqs.shape[1]
    running = np.concatenate(
        [np.ones((len(ids), 1), bool), np.cumsum(seqs == 1, axis=1)[:, :-1] == 0], axis=1
    )
    top2 = torch.stack(gen.scores, dim=1).topk(2, dim=-1).values.numpy()
    margin = np.where(running, top2[..., 0] - top2[..., 1], np.inf).min(axis=1)
    out = np.zeros((len(ids), MAX_NEW_TOKENS), np.int32)
    out[:, :steps] = seqs
    return out, margin


def _greedy_inputs(model, vocab: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two inputs (the second padded) whose greedy outputs vary, one stopping at EOS mid-way."""
    for _ in range(200):
        ids = rng.integers(2, vocab, (32, 9))
        ids[:, -1] = 1  # EOS, as the T5 tokenizer appends it
        mask = np.ones_like(ids)
        ids[16:, 6:], mask[16:, 6:], ids[16:, 5] = 0, 0, 1
        out, margin = _greedy(model, ids, mask)
        first_eos = np.where((out == 1).any(1), (out == 1).argmax(1), MAX_NEW_TOKENS)
        distinct = np.array([len(set(row[:n])) for row, n in zip(out, first_eos)])
        ok = (margin > 1e-2) & (distinct >= 2)
        stops = np.flatnonzero(ok & (first_eos >= 2) & (first_eos <= MAX_NEW_TOKENS - 3))
        runs = 16 + np.flatnonzero(
            ok[16:] & (first_eos[16:] == MAX_NEW_TOKENS) & (distinct[16:] >= 3)
        )
        if len(stops) and len(runs):
            rows = [stops[0], runs[0]]
            return ids[rows], mask[rows]
    raise RuntimeError("no input gives an EOS mid-way; change the boost or the seed")


def _build(spec: dict, out_dir: Path) -> None:
    spec = dict(spec)
    seed = spec.pop("seed")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    config = transformers.T5Config(**spec)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            if name.endswith("relative_attention_bias.weight"):
                param.copy_(3.0 * torch.randn_like(param))
        if spec["tie_word_embeddings"]:
            # A random tied model echoes its input token; a smaller embedding breaks the echo.
            model.shared.weight.mul_(0.3)
            head = model.shared.weight
        else:
            model.lm_head.weight = torch.nn.Parameter(
                torch.randn(spec["vocab_size"], spec["d_model"]) * spec["d_model"] ** -0.5
            )
            head = model.lm_head.weight
        head[1].mul_(EOS_BOOST)  # so that some greedy outputs stop at EOS
    state = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    drop = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    if spec["tie_word_embeddings"]:
        drop.add("lm_head.weight")
    state = {k: v for k, v in state.items() if k not in drop}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    hub_config = dict(
        architectures=["T5ForConditionalGeneration"],
        model_type="t5",
        is_encoder_decoder=True,
        initializer_factor=1.0,
        **spec,
    )
    (out_dir / "config.json").write_text(json.dumps(hub_config, indent=2, sort_keys=True) + "\n")

    # Reference: what HF reads back from the directory.
    ref = transformers.T5ForConditionalGeneration.from_pretrained(
        out_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    tied = ref.lm_head.weight.data_ptr() == ref.shared.weight.data_ptr()
    assert tied == spec["tie_word_embeddings"], "HF reloaded the head with the wrong tying"
    expected: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for i, batch in enumerate(_batches(spec["vocab_size"], rng)):
            logits = ref(**{k: torch.tensor(v) for k, v in batch.items()}).logits
            for key, value in batch.items():
                expected[f"batch{i}_{key}"] = value.astype(np.int32)
            expected[f"batch{i}_logits"] = logits.numpy().astype(np.float32)
        ids, mask = _greedy_inputs(ref, spec["vocab_size"], rng)
        greedy, margins = _greedy(ref, ids, mask)
        margin = float(margins.min())
        assert margin > 1e-3, f"greedy fixture too close to a tie: {margin=}"
        print(f"{out_dir.name}: greedy ids {greedy.tolist()} (min top-2 margin {margin:.4f})")
    expected["greedy_input_ids"] = ids.astype(np.int32)
    expected["greedy_attention_mask"] = mask.astype(np.int32)
    expected["greedy_ids"] = greedy
    rel = torch.arange(-300, 301)
    for name, bidirectional in (("bidirectional", True), ("causal", False)):
        buckets = T5Attention._relative_position_bucket(
            rel, bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        expected[f"buckets_{name}"] = buckets.numpy().astype(np.int8)
    np.savez_compressed(out_dir / "expected.npz", **expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    args = parser.parse_args()
    for name, spec in VARIANTS.items():
        _build(spec, args.out / name)
    total = sum(f.stat().st_size for name in VARIANTS for f in (args.out / name).iterdir())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {total} bytes")


if __name__ == "__main__":
    main()

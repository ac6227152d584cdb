"""Llama decoder: parity with transformers (HF folder and GGUF), KV cache, LoRA, vmap."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from scripts.make_llama_fixture import permute as llama_cpp_permute  # llama.cpp's, verbatim
from synthgen.models import kv_cache, llama
from synthgen.models.llama import Llama, LlamaConfig
from synthgen.models.llama_loading import load_llama, unpermute_rotary

FIXTURE = Path(__file__).parents[2] / "fixtures" / "llama_tiny"
ATOL = 1e-4


@pytest.fixture(scope="module")
def expected():
    return dict(np.load(FIXTURE / "expected.npz"))


@pytest.fixture(scope="module")
def hf_model():
    return load_llama(FIXTURE)


@functools.cache
def _jitted_apply(config):
    return jax.jit(lambda p, ids, mask: Llama(config).apply({"params": p}, ids, mask))


def _forward(config, params, ids, mask=None):
    mask = np.ones_like(ids) if mask is None else mask
    return np.asarray(_jitted_apply(config)(params, ids, mask))


def _check_parity(config, params, expected):
    for name in ("a", "b"):
        got = _forward(config, params, expected[f"ids_{name}"])
        np.testing.assert_allclose(got, expected[f"logits_{name}"], atol=ATOL, rtol=0)
    for side in ("right", "left"):
        mask = expected[f"{side}_mask"]
        got = _forward(config, params, expected[f"{side}_ids"], mask)
        real = mask.astype(bool)
        np.testing.assert_allclose(got[real], expected[f"{side}_logits"][real], atol=ATOL, rtol=0)


def test_hf_folder_matches_transformers(hf_model, expected):
    config, params, tokenizer = hf_model
    assert tokenizer is None  # the fixture folder has no tokenizer.json
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (2, 4, 2)
    assert not config.tie_word_embeddings and "lm_head" in params
    _check_parity(config, params, expected)


def test_gguf_matches_transformers_and_hf_weights(hf_model, expected):
    config, params, _ = load_llama(FIXTURE / "model.gguf")
    assert config.rms_norm_eps == pytest.approx(hf_model[0].rms_norm_eps)  # float32 in GGUF
    assert dataclasses.replace(config, rms_norm_eps=hf_model[0].rms_norm_eps) == hf_model[0]
    _check_parity(config, params, expected)
    flat_gguf = traverse_util.flatten_dict(params)
    for path, value in traverse_util.flatten_dict(hf_model[1]).items():
        np.testing.assert_array_equal(flat_gguf[path], value, err_msg=str(path))


@pytest.mark.parametrize("heads,kv_heads", [(9, 9), (9, 3)])
def test_unpermute_inverts_llama_cpp_permute(heads, kv_heads):
    w = np.random.default_rng(0).normal(size=(kv_heads * 64, 40))
    permuted = llama_cpp_permute(w, heads, kv_heads)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_rotary(permuted, kv_heads), w)


def _prompts_batch(lengths, total, side, vocab, seed=0):
    rng = np.random.default_rng(seed)
    rows = [rng.integers(3, vocab, size=n).tolist() for n in lengths]
    ids = np.zeros((len(rows), total), np.int32)
    mask = np.zeros((len(rows), total), np.int32)
    for r, row in enumerate(rows):
        pad = total - len(row)
        s = pad if side == "left" else 0
        ids[r, s : s + len(row)] = row
        mask[r, s : s + len(row)] = 1
    return rows, ids, mask


@pytest.mark.parametrize("split", [False, True], ids=["stacked", "split"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_cached_prefill_and_steps_match_full_forward(hf_model, side, split):
    config, params, _ = hf_model
    if split:  # the per-layer form FlaxLM holds: the same numbers
        params = kv_cache.decode_params(params)
        assert len(params["layers"]) == config.num_layers
    lengths, steps = [3, 7, 5], 4
    rows, ids, mask = _prompts_batch(lengths, 8, side, config.vocab_size)
    continuation = np.random.default_rng(1).integers(3, config.vocab_size, size=(3, steps))
    cache = kv_cache.init_cache(config, 3, 8 + steps)
    logits, cache = jax.jit(kv_cache.prefill)(params, cache, ids, mask)
    got = [np.asarray(logits)]
    step = jax.jit(kv_cache.step, donate_argnums=1)
    for s in range(steps - 1):
        logits, cache = step(params, cache, continuation[:, s])
        got.append(np.asarray(logits))
    got = np.stack(got, axis=1)  # [B, steps, V]
    for r, row in enumerate(rows):
        row = row + continuation[r, : steps - 1].tolist()
        full = _forward(config, hf_model[1], np.array([row]))
        np.testing.assert_allclose(got[r], full[0, lengths[r] - 1 :], atol=ATOL, rtol=0)
    assert cache.positions.tolist() == [n + steps - 1 for n in lengths]


def test_extend_after_a_cached_prefix_matches_full_forward(hf_model):
    """prefill(prefix) -> extend(ragged documents, right-padded: holes in the cache) ->
    extend(question, left-padded) -> step equals one forward pass of the whole row."""
    config, params, _ = hf_model
    rng = np.random.default_rng(2)
    prefix = rng.integers(3, config.vocab_size, size=4).tolist()
    docs, doc_ids, doc_mask = _prompts_batch([2, 6, 1], 6, "right", config.vocab_size, seed=3)
    tails, tail_ids, tail_mask = _prompts_batch([3, 1, 5], 5, "left", config.vocab_size, seed=4)
    nxt = rng.integers(3, config.vocab_size, size=3)
    cache = kv_cache.init_cache(config, 3, 4 + 6 + 5 + 1)
    ones = np.ones((3, 4), np.int32)
    _, cache = jax.jit(kv_cache.prefill)(params, cache, np.array([prefix] * 3), ones)
    extend = jax.jit(kv_cache.extend)
    _, cache = extend(params, cache, doc_ids, doc_mask)
    after_tail, cache = extend(params, cache, tail_ids, tail_mask)
    after_step, cache = jax.jit(kv_cache.step)(params, cache, nxt)
    for r in range(3):
        row = prefix + docs[r] + tails[r] + [int(nxt[r])]
        full = _forward(config, params, np.array([row]))[0]
        np.testing.assert_allclose(after_tail[r], full[-2], atol=ATOL, rtol=0)
        np.testing.assert_allclose(after_step[r], full[-1], atol=ATOL, rtol=0)
    assert cache.positions.tolist() == [
        len(prefix) + len(d) + len(t) + 1 for d, t in zip(docs, tails, strict=True)
    ]
    assert int(cache.index) == 4 + 6 + 5 + 1


def test_prefill_checks_cache_size(hf_model):
    config, params, _ = hf_model
    cache = kv_cache.init_cache(config, 1, 4)
    with pytest.raises(ValueError, match="longer than the cache"):
        kv_cache.prefill(params, cache, np.ones((1, 5), np.int32), np.ones((1, 5), np.int32))


def test_padding_does_not_change_real_positions_under_vmap():
    config = LlamaConfig.tiny()
    params = llama.init_params(config, jax.random.key(0))
    _, ids, mask = _prompts_batch([4, 9], 12, "left", config.vocab_size, seed=3)
    batch = _forward(config, params, ids, mask)

    def one(i, m):
        return Llama(config).apply({"params": params}, i[None], m[None])[0]

    per_example = np.asarray(jax.jit(jax.vmap(one))(ids, mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(per_example[real], batch[real], atol=1e-5, rtol=0)

    def loss(p, i, m):
        logits = Llama(config).apply({"params": p}, i[None], m[None])[0]
        return jnp.sum(jax.nn.log_softmax(logits) * m[:, None])

    grads = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(params, ids, mask)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_lora_with_zero_b_leaves_logits_unchanged(hf_model, expected):
    base_config, base_params, _ = hf_model
    targets = ("q", "k", "v", "o", "gate", "up", "down")
    config, params, _ = load_llama(
        FIXTURE, lora_rank=4, lora_targets=targets, key=jax.random.key(7)
    )
    flat = traverse_util.flatten_dict(params)
    lora = {k: v for k, v in flat.items() if k[-1] in ("lora_a", "lora_b")}
    assert len(lora) == 2 * len(targets)
    assert flat[("layers", "attn", "q", "lora_a")].shape == (2, 32, 4)
    assert float(jnp.abs(flat[("layers", "attn", "q", "lora_a")]).max()) > 0
    ids = expected["ids_a"]
    base = _forward(base_config, base_params, ids)
    np.testing.assert_allclose(_forward(config, params, ids), base, atol=1e-6, rtol=0)
    flat[("layers", "mlp", "up", "lora_b")] = jnp.full((2, 4, 64), 0.05)
    moved = _forward(config, traverse_util.unflatten_dict(flat), ids)
    assert np.abs(moved - base).max() > 1e-3


def test_tied_embeddings_and_bfloat16():
    config = LlamaConfig.tiny(tie_word_embeddings=True)
    params = llama.init_params(config, jax.random.key(1))
    assert "lm_head" not in params
    ids = np.arange(10, dtype=np.int32)[None]
    full = _forward(config, params, ids)
    low = _forward(dataclasses.replace(config, dtype="bfloat16"), params, ids)
    assert low.dtype == np.float32
    np.testing.assert_allclose(low, full, atol=0.1, rtol=0)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(num_kv_heads=3), "num_kv_heads must divide"),
        (dict(lora_targets=("q", "lm_head")), "lora_targets"),
        (dict(dtype="float64"), "dtype"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(head_dim=7), "head_dim"),
    ],
)
def test_config_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.tiny(**overrides)


def test_load_llama_rejects_unknown_source(tmp_path):
    with pytest.raises(ValueError, match="name_or_path"):
        load_llama(tmp_path / "missing")


def test_logit_window_equals_full_logits_sliced(hf_model, expected):
    config, params, _ = hf_model
    ids, mask = expected["right_ids"], expected["right_mask"]
    full = _forward(config, params, ids, mask)
    starts = np.array([1, 3] + [0] * (len(ids) - 2), np.int32)[: len(ids)]
    window = np.asarray(
        Llama(config).apply(
            {"params": params}, ids, mask, window_start=jnp.asarray(starts), window_len=4
        )
    )
    assert window.shape == (len(ids), 4, config.vocab_size)
    for row, start in enumerate(starts):
        np.testing.assert_allclose(window[row], full[row, start : start + 4], atol=1e-5, rtol=0)

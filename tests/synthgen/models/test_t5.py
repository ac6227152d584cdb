"""T5: parity with Hugging Face fixtures, KV-cache decoding, the loader, LoRA, presets,
SentencePiece tokenizers.

The fixtures (tests/fixtures/t5_tiny_v1_*) were written once by scripts/make_t5_fixture.py
with transformers 5.23 / torch 2.13 (CPU, float32, eager attention).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import unicodedata
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from synthgen.models.lora import is_lora_path
from synthgen.models.sampling import SamplingConfig
from synthgen.models.sentencepiece_tokenizer import (
    SentencePieceTokenizer,
    TokenizerJsonTokenizer,
    load_tokenizer,
    train_sentencepiece,
)
from synthgen.models.t5 import T5, T5Config, relative_position_buckets, shift_right
from synthgen.models.t5_decoding import decode_step, init_cache, prepare_decoding, t5_generate
from synthgen.models.t5_loading import load_t5
from synthgen.models.tokenizer import Tokenizer

FIXTURES = Path(__file__).parents[2] / "fixtures"
VARIANTS = ("t5_tiny_v1_0", "t5_tiny_v1_1")
BATCH_KEYS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")


@pytest.fixture(scope="module", params=VARIANTS)
def fixture(request):
    path = FIXTURES / request.param
    config, params, tokenizer = load_t5(path, require_tokenizer=False)
    assert tokenizer is None
    return path, config, params, dict(np.load(path / "expected.npz"))


def _apply(config, params, **batch):
    return jax.jit(T5(config).apply)({"params": params}, **batch)


def _batch(expected, i):
    return {key: expected[f"batch{i}_{key}"] for key in BATCH_KEYS}


def _with_lora_b(params, value: float):
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {k: (jnp.full_like(v, value) if k[-1] == "lora_b" else v) for k, v in flat.items()}
    )


# ---- parity with Hugging Face ---------------------------------------------------------------


def test_fixture_configs_are_read_exactly(fixture):
    path, config, _, _ = fixture
    hf = json.loads((path / "config.json").read_text())
    assert config.num_layers == hf["num_layers"]
    assert config.num_decoder_layers == hf["num_decoder_layers"]
    assert config.tie_word_embeddings == hf["tie_word_embeddings"]
    assert config.is_gated == (hf["feed_forward_proj"] == "gated-gelu")
    assert config.num_layers != config.num_decoder_layers or config.is_gated


@pytest.mark.parametrize("batch", [0, 1])
def test_logits_match_hf(fixture, batch):
    _, config, params, expected = fixture
    logits = _apply(config, params, **_batch(expected, batch))
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, expected[f"batch{batch}_logits"], atol=1e-4, rtol=0)


def test_relative_position_buckets_match_hf():
    expected = np.load(FIXTURES / VARIANTS[0] / "expected.npz")
    for name, bidirectional in (("bidirectional", True), ("causal", False)):
        # Row `300` of [601, 601] buckets holds key - query = -300 .. 300.
        buckets = relative_position_buckets(
            601, 601, bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        np.testing.assert_array_equal(buckets[300], expected[f"buckets_{name}"])


def test_greedy_generate_matches_hf(fixture):
    _, config, params, expected = fixture
    ids = t5_generate(
        config,
        params,
        expected["greedy_input_ids"],
        expected["greedy_attention_mask"],
        max_new_tokens=10,
        sampling=SamplingConfig(),
        key=jax.random.key(0),
    )
    assert ids.dtype == jnp.int32
    np.testing.assert_array_equal(ids, expected["greedy_ids"])
    assert (expected["greedy_ids"] == config.eos_token_id).any()  # the fixture covers EOS


# ---- decoding ---------------------------------------------------------------------------------


def test_cached_decoding_equals_teacher_forcing(fixture):
    _, config, params, expected = fixture
    batch = _batch(expected, 1)
    dec = batch["decoder_input_ids"]
    forced = _apply(config, params, **{k: batch[k] for k in BATCH_KEYS[:3]})
    cross = prepare_decoding(config, params, batch["input_ids"], batch["attention_mask"])
    cache = init_cache(config, dec.shape[0], dec.shape[1])
    step = jax.jit(decode_step, static_argnums=0)
    for t in range(dec.shape[1]):
        logits, cache = step(
            config,
            params,
            jnp.asarray(dec[:, t]),
            jnp.int32(t),
            cache,
            cross,
            batch["attention_mask"],
        )
        np.testing.assert_allclose(logits, forced[:, t], atol=1e-4, rtol=0)


def test_sampling_is_keyed_and_pads_after_eos(fixture):
    _, config, params, expected = fixture
    ids, mask = expected["batch1_input_ids"], expected["batch1_attention_mask"]
    sampling = SamplingConfig(temperature=1.0, top_p=0.95)

    def run(key):
        out = t5_generate(
            config, params, ids, mask, max_new_tokens=12, sampling=sampling, key=key, num_samples=3
        )
        return np.asarray(out)

    a, b, c = run(jax.random.key(1)), run(jax.random.key(1)), run(jax.random.key(2))
    assert a.shape == (ids.shape[0] * 3, 12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len({tuple(row) for row in a}) > 1  # samples of one input differ
    for row in a:
        eos = np.flatnonzero(row == config.eos_token_id)
        if eos.size:
            assert (row[eos[0] + 1 :] == config.pad_token_id).all()


def test_num_samples_equal_repeated_inputs(fixture):
    _, config, params, expected = fixture
    ids, mask = expected["batch1_input_ids"], expected["batch1_attention_mask"]
    kwargs = dict(max_new_tokens=6, sampling=SamplingConfig(), key=jax.random.key(0))
    grouped = t5_generate(config, params, ids, mask, num_samples=3, **kwargs)
    repeated = t5_generate(config, params, np.repeat(ids, 3, 0), np.repeat(mask, 3, 0), **kwargs)
    np.testing.assert_array_equal(grouped, repeated)


def test_generate_validates_arguments(fixture):
    _, config, params, expected = fixture
    ids, mask = expected["greedy_input_ids"], expected["greedy_attention_mask"]
    with pytest.raises(ValueError, match="max_new_tokens"):
        t5_generate(
            config,
            params,
            ids,
            mask,
            max_new_tokens=0,
            sampling=SamplingConfig(),
            key=jax.random.key(0),
        )
    with pytest.raises(ValueError, match="attention_mask"):
        t5_generate(
            config,
            params,
            ids,
            mask[:, :3],
            max_new_tokens=2,
            sampling=SamplingConfig(),
            key=jax.random.key(0),
        )


# ---- training path ------------------------------------------------------------------------


def test_vmapped_per_example_loss_and_grads(fixture):
    """The DP training path: per-example grads by vmap over B=1 calls, with and without remat."""
    _, config, params, expected = fixture
    batch = _batch(expected, 1)

    def make_loss(cfg):
        def loss(p, ex):
            logits = T5(cfg).apply({"params": p}, *(ex[k][None] for k in BATCH_KEYS))
            return jnp.mean(jax.nn.logsumexp(logits, axis=-1))

        return loss

    values, grads = jax.jit(jax.vmap(jax.value_and_grad(make_loss(config)), (None, 0)))(
        params, batch
    )
    hf = expected["batch1_logits"].astype(np.float64)
    hf_values = np.log(np.exp(hf).sum(-1)).mean(-1)
    np.testing.assert_allclose(values, hf_values, atol=1e-4)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))

    remat = make_loss(dataclasses.replace(config, remat=True))
    value1, grads1 = jax.jit(jax.value_and_grad(remat))(params, {k: v[1] for k, v in batch.items()})
    np.testing.assert_allclose(value1, values[1], rtol=1e-5)
    jax.tree.map(lambda g, g1: np.testing.assert_allclose(g[1], g1, atol=1e-5), grads, grads1)


def test_shift_right():
    labels = jnp.array([[5, 6, 1, -100], [7, 1, 0, 0]])
    np.testing.assert_array_equal(shift_right(labels, 0, 0), [[0, 5, 6, 1], [0, 7, 1, 0]])


def test_bfloat16_compute_stays_close(fixture):
    _, config, params, expected = fixture
    logits = _apply(dataclasses.replace(config, dtype="bfloat16"), params, **_batch(expected, 0))
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, expected["batch0_logits"], atol=0.15, rtol=0)


# ---- loader, LoRA -------------------------------------------------------------------------------


def test_lora_zero_b_is_identity(fixture):
    path, config, params, expected = fixture
    targets = ("q", "k", "v", "o", "wi", "wo")
    config_l, params_l, _ = load_t5(
        path, lora_rank=4, lora_targets=targets, require_tokenizer=False
    )
    lora = [k for k in traverse_util.flatten_dict(params_l) if is_lora_path(k)]
    ff = 3 if config.is_gated else 2
    blocks = (4 + ff) * config.num_layers + (8 + ff) * config.num_decoder_layers
    assert len(lora) == 2 * blocks  # lora_a and lora_b of every targeted projection
    batch = _batch(expected, 0)
    logits = _apply(config_l, params_l, **batch)
    np.testing.assert_allclose(logits, expected["batch0_logits"], atol=1e-4, rtol=0)

    trained = _with_lora_b(params_l, 0.01)
    tuned = _apply(config_l, trained, **batch)
    assert np.abs(np.asarray(tuned) - expected["batch0_logits"]).max() > 1e-3


def test_loader_is_exact(tmp_path):
    src = FIXTURES / "t5_tiny_v1_1"
    config, params, _ = load_t5(src, require_tokenizer=False)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    save_file(
        {k: v for k, v in tensors.items() if "block.1.layer.0.SelfAttention.k" not in k},
        tmp_path / "model.safetensors",
    )
    with pytest.raises(ValueError, match="lacks"):
        load_t5(tmp_path, require_tokenizer=False)
    save_file(
        {**tensors, "encoder.extra.weight": tensors["shared.weight"]},
        tmp_path / "model.safetensors",
    )
    with pytest.raises(ValueError, match="unused"):
        load_t5(tmp_path, require_tokenizer=False)
    # The aliases HF writes or ignores are accepted.
    aliases = {
        "encoder.embed_tokens.weight": tensors["shared.weight"],
        "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": np.zeros(
            (32, 4), np.float32
        ),
    }
    save_file({**tensors, **aliases}, tmp_path / "model.safetensors")
    _, params2, _ = load_t5(tmp_path, require_tokenizer=False)
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        load_t5(tmp_path)


def test_hf5_style_config_is_untied():
    hf = json.loads((FIXTURES / "t5_tiny_v1_1" / "config.json").read_text())
    hf.update(tie_word_embeddings=True, scale_decoder_outputs=False)
    assert not T5Config.from_hf_config(hf).tie_word_embeddings
    hf.pop("scale_decoder_outputs")
    assert T5Config.from_hf_config(hf).tie_word_embeddings


# ---- configs ---------------------------------------------------------------------------------


def _param_count(config: T5Config) -> int:
    ids = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: T5(config).init(jax.random.key(0), ids, ids + 1, ids))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize(
    "name, count",
    [
        # HF T5ForConditionalGeneration.num_parameters() of the published checkpoints.
        ("small", 60_506_624),
        ("base", 222_903_552),
        ("v1_1-small", 76_961_152),
    ],
)
def test_preset_sizes(name, count):
    config = T5Config.preset(name)
    assert _param_count(config) == count


def test_presets_documented_shapes():
    small = T5Config.preset("small")
    assert (small.d_model, small.num_layers, small.num_heads, small.d_ff, small.vocab_size) == (
        512,
        6,
        8,
        2048,
        32128,
    )
    assert small.tie_word_embeddings and small.feed_forward_proj == "relu"
    v11 = T5Config.preset("v1_1-small")
    assert (
        v11.d_model,
        v11.num_layers,
        v11.num_decoder_layers,
        v11.num_heads,
        v11.d_ff,
        v11.d_kv,
    ) == (512, 8, 8, 6, 1024, 64)
    assert not v11.tie_word_embeddings and v11.feed_forward_proj == "gated-gelu"
    large = T5Config.preset("large")
    assert (large.d_model, large.num_layers, large.num_heads, large.d_ff) == (1024, 24, 16, 4096)
    tiny = T5Config.preset("tiny")
    assert tiny.d_model <= 64 and tiny.vocab_size <= 1024 and tiny.num_layers == 2
    assert _param_count(T5Config.preset("tiny", lora_rank=2)) > _param_count(tiny)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(feed_forward_proj="swish-gelu"), "feed_forward_proj"),
        (dict(lora_targets=("q", "z")), "lora_targets"),
        (dict(d_model=0), "d_model"),
        (dict(dtype="int8"), "dtype"),
        (dict(eos_token_id=4096), "eos_token_id"),
    ],
)
def test_config_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        T5Config.preset("tiny", **overrides)
    with pytest.raises(ValueError, match="preset"):
        T5Config.preset("xxl")


# ---- tokenizers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wiki_docs():
    from synthgen.corpora import load_wiki_summaries

    return load_wiki_summaries(limit=300)["document"]


@pytest.fixture(scope="module")
def trained(wiki_docs, tmp_path_factory):
    return train_sentencepiece(wiki_docs, 512, tmp_path_factory.mktemp("spm"))


def test_trained_sentencepiece_round_trip(trained, wiki_docs):
    tok = trained
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (512, 0, 1, None, 2)
    ids = tok.encode(wiki_docs[0])
    assert 0 < len(ids) < len(wiki_docs[0]) and tok.eos_id not in ids and tok.pad_id not in ids
    assert tok.decode(ids) == wiki_docs[0]
    assert tok.decode(ids + [tok.eos_id, tok.pad_id, tok.pad_id]) == wiki_docs[0]
    # SentencePiece normalises (NFKC, whitespace runs -> one space) and maps characters outside
    # the 0.9995 coverage to unk; every other document round-trips exactly.
    known = [d for d in wiki_docs if tok.unk_id not in tok.encode(d)]
    assert len(known) > 0.8 * len(wiki_docs)
    for doc in known:
        assert tok.decode(tok.encode(doc)) == " ".join(unicodedata.normalize("NFKC", doc).split())
    reloaded = SentencePieceTokenizer.load(tok.model_file.parent)
    assert reloaded.encode(wiki_docs[1]) == tok.encode(wiki_docs[1])


def _sentencepiece_pb2():
    """sentencepiece's ModelProto module. Its generated code may be newer than the installed
    protobuf runtime (the `beam` extra pins protobuf 6, sentencepiece 0.2.3 was generated with
    7): then the same source is loaded without the runtime-version check, which the
    descriptor itself does not need."""
    import importlib.util
    import re
    import types

    from google.protobuf.runtime_version import VersionError

    try:
        import sentencepiece.sentencepiece_model_pb2 as pb

        return pb
    except VersionError:
        spec = importlib.util.find_spec("sentencepiece.sentencepiece_model_pb2")
        source = open(spec.origin, encoding="utf-8").read()
        source = re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n", "", source)
        module = types.ModuleType("sentencepiece_model_pb2")
        exec(compile(source, spec.origin, "exec"), module.__dict__)
        return module


def test_tokenizer_json_matches_sentencepiece(trained, wiki_docs, tmp_path, monkeypatch):
    from tokenizers.implementations import SentencePieceUnigramTokenizer

    pb = _sentencepiece_pb2()

    monkeypatch.setitem(sys.modules, "sentencepiece_model_pb2", pb)  # what from_spm imports
    converted = SentencePieceUnigramTokenizer.from_spm(str(trained.model_file))
    converted.add_special_tokens(["<pad>", "</s>", "<unk>"])  # as in HF's T5 tokenizer.json
    converted.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, TokenizerJsonTokenizer) and isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.pad_id, tok.eos_id, tok.bos_id) == (512, 0, 1, None)
    for doc in wiki_docs[:100]:
        assert tok.encode(doc) == trained.encode(doc)
    ids = trained.encode(wiki_docs[0])
    assert tok.decode(ids + [1, 0]) == trained.decode(ids + [1, 0])


def test_load_t5_reads_the_tokenizer(trained, tmp_path):
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(FIXTURES / "t5_tiny_v1_0" / name, tmp_path / name)
    trained.save(tmp_path)
    _, _, tok = load_t5(tmp_path)
    assert isinstance(tok, SentencePieceTokenizer)
    assert tok.encode("a query") == trained.encode("a query")


def test_sentencepiece_validation(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_sentencepiece(["some text"], 4, tmp_path)
    with pytest.raises(ValueError, match="non-empty"):
        train_sentencepiece(["  ", ""], 64, tmp_path)


def test_a_cached_vocabulary_is_trained_once_per_texts(wiki_docs, trained, tmp_path, monkeypatch):
    import sentencepiece as spm

    cache = tmp_path / "cache"
    first = train_sentencepiece(wiki_docs, 512, tmp_path / "a", cache=cache)
    assert first.encode(wiki_docs[0]) == trained.encode(wiki_docs[0])  # as without a cache
    assert len(list(cache.iterdir())) == 1
    monkeypatch.setattr(spm.SentencePieceTrainer, "train", lambda **_: pytest.fail("trained"))
    again = train_sentencepiece(wiki_docs, 512, tmp_path / "b", cache=cache)
    assert (tmp_path / "b" / "spiece.model").read_bytes() == first.model_file.read_bytes()
    with pytest.raises(pytest.fail.Exception):  # other texts: another key, trained
        train_sentencepiece(wiki_docs[1:], 512, tmp_path / "c", cache=cache)
    assert again.vocab_size == 512

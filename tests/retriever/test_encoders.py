"""Text encoders: parity with sentence-transformers, pooling, batching, save/load, errors."""

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import traverse_util
from safetensors.numpy import save_file

from retriever import bert, encoders, wordpiece
from synthgen.models.t5 import T5
from synthgen.models.t5_loading import load_t5

FIXTURES = Path(__file__).parents[1] / "fixtures"
T5_TINY = FIXTURES / "t5_tiny_v1_0"
TEXTS = [
    "Hello world!",
    "Where is the city university?",
    "the music of the war years",
    "A search query about private data, with PUNCTUATION; and numbers 1 2 3.",
    "x",
    "first team game",
    "Retrieval model for documents.",
]


@pytest.fixture(scope="module")
def minilm():
    return encoders.load_encoder("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def tiny_bert():
    return encoders.random_encoder("bert", seed=1, vocab_texts=TEXTS)


@pytest.fixture(scope="module")
def tiny_t5():
    return encoders.random_encoder("t5", seed=0)


def test_minilm_matches_sentence_transformers(minilm):
    # Golden values from scripts/make_minilm_fixture.py (sentence-transformers 6.2, torch 2.13).
    expected = np.load(FIXTURES / "minilm" / "expected.npz")
    sentences = [str(s) for s in expected["sentences"]]
    max_len = int(expected["max_seq_length"])
    assert (minilm.family, minilm.dim, minilm.max_len) == ("bert", 384, max_len)

    batch = minilm.tokenize(sentences, max_len)
    width = expected["input_ids"].shape[1]
    np.testing.assert_array_equal(batch["input_ids"][:, :width], expected["input_ids"])
    np.testing.assert_array_equal(batch["attention_mask"][:, :width], expected["attention_mask"])
    assert not batch["attention_mask"][:, width:].any()

    got = minilm.encode(sentences, batch_size=8, max_len=max_len)
    assert got.dtype == np.float32 and got.shape == expected["embeddings"].shape
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.min(np.sum(got * expected["embeddings"], axis=1)) >= 0.999
    np.testing.assert_allclose(got, expected["embeddings"], atol=1e-4)


def test_padding_does_not_change_an_embedding(minilm):
    alone = minilm.encode(["What is the capital of France?"], batch_size=1, max_len=16)
    batch = minilm.encode(
        ["a much longer sentence that fills more of the padded batch", "What is the capital "
         "of France?", "hi"],
        batch_size=4,
        max_len=32,
    )  # fmt: skip
    np.testing.assert_allclose(batch[1], alone[0], atol=1e-5)


def test_batches_that_do_not_divide_n(tiny_bert):
    one_batch = tiny_bert.encode(TEXTS, batch_size=len(TEXTS), max_len=24)
    in_threes = tiny_bert.encode(TEXTS, batch_size=3, max_len=24, progress=True)
    np.testing.assert_allclose(in_threes, one_batch, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(in_threes, axis=1), 1.0, atol=1e-5)
    assert len(set(np.round(in_threes[:, 0], 6))) == len(TEXTS)  # distinct texts, vectors
    assert tiny_bert.encode([]).shape == (0, tiny_bert.dim)


def _mixed_lengths(n=13, seed=3):
    """Texts of 1 to 80 words (some longer than 64 tokens), in no order of length."""
    rng = np.random.default_rng(seed)
    words = " ".join(TEXTS).split()
    return [" ".join(rng.choice(words, size=int(k))) for k in rng.integers(1, 80, n)]


def test_encode_sorts_by_length_and_pads_to_few_buckets(tiny_bert, monkeypatch):
    texts = _mixed_lengths()
    full = tiny_bert.tokenize(texts, 64)  # the old path: every text padded to max_len
    lengths = full["attention_mask"].sum(1)
    assert lengths.min() < 16 and lengths.max() == 64 and (np.diff(lengths) < 0).any()
    want = np.asarray(tiny_bert._jit_apply(tiny_bert.params, full))

    shapes = []
    jitted = tiny_bert._jit_apply_in_steps

    def spy(params, batch, rows_per_step):
        shapes.append(batch["input_ids"].shape)
        return jitted(params, batch, rows_per_step)

    monkeypatch.setattr(tiny_bert, "_jit_apply_in_steps", spy)
    got = tiny_bert.encode(texts, batch_size=4, max_len=64)
    np.testing.assert_allclose(got, want, atol=1e-5)  # same values, original order
    alone = [tiny_bert.encode([t], batch_size=1, max_len=64)[0] for t in texts[:2]]
    np.testing.assert_allclose(got[:2], np.stack(alone), atol=1e-5)

    buckets = encoders._bucket_lengths(64)
    rows, widths = zip(*shapes[:4])
    assert set(rows) == {4} and list(widths) == sorted(widths) and set(widths) <= set(buckets)
    longest = np.sort(lengths)[3::4].tolist() + [lengths.max()]  # each batch's longest text
    assert list(widths) == [min(b for b in buckets if b >= n) for n in longest]
    assert widths[0] < 64  # short texts are not padded to max_len


def test_cpu_steps_leave_embeddings_unchanged(tiny_bert, monkeypatch):
    texts = TEXTS + _mixed_lengths(n=11, seed=7)
    want = np.asarray(tiny_bert._jit_apply(tiny_bert.params, tiny_bert.tokenize(texts, 64)))
    assert encoders._rows_per_step(256, 64) == (4 if jax.default_backend() == "cpu" else 64)
    assert encoders._rows_per_step(16, 64) == 64  # short texts: the whole batch at once
    monkeypatch.setattr(encoders, "_CPU_TOKENS_PER_STEP", 48)  # 3 rows of 16, 1 row of 64
    steps = []
    jitted = tiny_bert._jit_apply_in_steps

    def spy(params, batch, rows_per_step):
        steps.append((batch["input_ids"].shape, rows_per_step))
        return jitted(params, batch, rows_per_step)

    monkeypatch.setattr(tiny_bert, "_jit_apply_in_steps", spy)
    got = tiny_bert.encode(texts, batch_size=4, max_len=64)
    np.testing.assert_allclose(got, want, atol=1e-5)
    if jax.default_backend() == "cpu":  # rows padded to whole steps
        assert ((6, 16), 3) in steps and ((4, 32), 1) in steps and ((4, 64), 1) in steps


def test_bucket_lengths_are_few_and_bound_the_padding():
    for max_len in (2, 16, 24, 100, 128, 256, 384, 512, 1024):
        buckets = encoders._bucket_lengths(max_len)
        assert buckets[-1] == max_len and list(buckets) == sorted(set(buckets))
        assert len(buckets) <= (8 if max_len <= 128 else 11)
        assert max(np.diff((0, *buckets))) <= max(16, max_len // 8 + 15)


def test_random_t5_bucketed_encode_matches_full_padding(tiny_t5):
    texts = _mixed_lengths(n=7, seed=5)
    want = tiny_t5._jit_apply(tiny_t5.params, tiny_t5.tokenize(texts, 32))
    got = tiny_t5.encode(texts, batch_size=3, max_len=32)
    np.testing.assert_allclose(got, np.asarray(want), atol=1e-5)


def test_apply_is_jittable_and_differentiable(tiny_bert):
    batch = tiny_bert.tokenize(TEXTS[:2], 16)

    def similarity(params):
        embeddings = tiny_bert.apply(params, batch)
        return embeddings[0] @ embeddings[1]

    grads = jax.jit(jax.grad(similarity))(tiny_bert.params)
    sizes = [float(np.abs(g).sum()) for g in jax.tree.leaves(grads)]
    assert np.all(np.isfinite(sizes)) and max(sizes) > 0


def test_save_load_round_trip(tiny_bert, tmp_path):
    rng = np.random.default_rng(7)
    tuned = jax.tree.map(
        lambda p: p + rng.normal(0, 0.05, p.shape).astype(np.float32), tiny_bert.params
    )
    encoders.save_encoder(tiny_bert, tuned, tmp_path / "enc", extra={"epochs": 2})
    meta = json.loads((tmp_path / "enc" / "encoder.json").read_text())
    assert (meta["base"], meta["family"], meta["dim"], meta["epochs"]) == (
        "random:bert",
        "bert",
        64,
        2,
    )
    loaded = encoders.load_encoder(tmp_path / "enc")
    assert loaded.name == "random:bert"
    np.testing.assert_array_equal(
        loaded.encode(TEXTS, max_len=24), tiny_bert.encode(TEXTS, params=tuned, max_len=24)
    )
    with pytest.raises(ValueError, match="reserved"):
        encoders.save_encoder(tiny_bert, tuned, tmp_path / "bad", extra={"base": "x"})
    with pytest.raises(ValueError, match="missing parameter"):
        encoders.save_encoder(tiny_bert, {"layer_0": tuned["layer_0"]}, tmp_path / "bad")


def _hf_bert_folder(encoder, out: Path, prefix: str = "bert.") -> dict[str, np.ndarray]:
    """Writes `encoder` as a HF BERT folder (torch layout), returns its tensors."""
    flat = traverse_util.flatten_dict(encoder.params)
    tensors = {}
    for path, (name, transpose) in bert.bert_name_map(encoder.config).items():
        value = np.asarray(flat[path])
        tensors[prefix + name] = np.ascontiguousarray(value.T if transpose else value)
    tensors[prefix + "pooler.dense.weight"] = np.zeros((encoder.dim, encoder.dim), np.float32)
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    config = {"model_type": "bert", **dataclasses.asdict(encoder.config)}
    (out / "config.json").write_text(json.dumps(config))
    wordpiece.wordpiece_tokenizer(encoder.vocab).save(str(out / "tokenizer.json"))
    return tensors


def test_hf_bert_folder_with_prefix_loads_and_missing_tensor_is_named(tiny_bert, tmp_path):
    tensors = _hf_bert_folder(tiny_bert, tmp_path / "hf")
    loaded = encoders.load_encoder(str(tmp_path / "hf"))
    assert loaded.max_len == tiny_bert.config.max_position_embeddings
    np.testing.assert_allclose(
        loaded.encode(TEXTS, max_len=24), tiny_bert.encode(TEXTS, max_len=24), atol=1e-6
    )
    del tensors["bert.encoder.layer.1.output.dense.weight"]
    save_file(tensors, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.output\.dense\.weight"):
        encoders.load_encoder(tmp_path / "hf")


def test_t5_encoder_is_masked_mean_of_encoder_states(tmp_path):
    encoder = encoders.load_encoder(T5_TINY)
    assert (encoder.family, encoder.dim) == ("t5", 32)
    assert sorted(encoder.params) == ["encoder", "shared"]  # one tower: no decoder
    config, full_params, _ = load_t5(T5_TINY, require_tokenizer=False)
    ids = np.array([[5, 9, 17, 1, 0, 0], [7, 3, 11, 4, 8, 1]], np.int32)
    mask = (np.arange(6) < np.array([[4], [6]])).astype(np.int32)
    states = np.asarray(T5(config).apply({"params": full_params}, ids, mask, method=T5.encode))
    mean = (states * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    want = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    got = encoder.apply(encoder.params, {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
    with pytest.raises(ValueError, match="no tokenizer"):
        encoder.encode(["text"])

    encoders.save_encoder(encoder, encoder.params, tmp_path / "t5", extra=None)
    again = encoders.load_encoder(tmp_path / "t5")
    assert again.name == str(T5_TINY)
    np.testing.assert_array_equal(
        np.asarray(again.apply(again.params, {"input_ids": ids, "attention_mask": mask})),
        np.asarray(got),
    )


def test_t5_folder_with_sentencepiece_appends_eos(tmp_path):
    from synthgen.models.sentencepiece_tokenizer import train_sentencepiece

    folder = tmp_path / "t5"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((T5_TINY / name).read_bytes())
    sp = train_sentencepiece(TEXTS * 4, 60, folder)  # ids < the fixture's vocab of 128
    encoder = encoders.load_encoder(folder, max_len=64)
    batch = encoder.tokenize(TEXTS[:2], 16)
    want = sp.encode(TEXTS[1])[:15] + [sp.eos_id]
    assert batch["input_ids"][1, : len(want)].tolist() == want
    assert (
        batch["attention_mask"][1].sum() == len(want)
        and (batch["input_ids"][1, len(want) :] == 0).all()
    )
    got = encoder.encode(TEXTS[:2], max_len=16)
    np.testing.assert_allclose(got, np.asarray(encoder.apply(encoder.params, batch)), atol=1e-6)


def test_random_t5_encodes_with_eos_and_padding_invariance(tiny_t5):
    encoder = tiny_t5
    batch = encoder.tokenize(["the world", "x"], 8)
    # Two words, then EOS (1), then padding (0); T5 inputs have no [CLS].
    assert batch["attention_mask"].sum(1).tolist() == [3, 2]
    assert batch["input_ids"][0, 2:4].tolist() == [1, 0]
    alone = encoder.encode(["the city"], batch_size=1, max_len=8)
    padded = encoder.encode(["a longer text about the city and the world", "the city"], max_len=16)
    np.testing.assert_allclose(padded[1], alone[0], atol=1e-5)


def test_errors(tmp_path, tiny_bert):
    with pytest.raises(FileNotFoundError, match="no encoder folder or known asset"):
        encoders.load_encoder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        encoders.load_encoder(tmp_path / "empty")
    with pytest.raises(ValueError, match="max_len"):
        tiny_bert.tokenize(["text"], tiny_bert.max_len + 1)
    with pytest.raises(ValueError, match="single str"):
        tiny_bert.encode("text")
    with pytest.raises(ValueError, match="family"):
        encoders.random_encoder("gpt")
    with pytest.raises(ValueError, match="hidden_size"):
        bert.BertConfig.tiny(num_attention_heads=5)

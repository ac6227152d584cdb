"""`DPRag(document_cache=True)`: the documents' keys and values computed once give the
same answers as running every whole prompt, for every mechanism, at the same public shape."""

import dataclasses

import jax
import numpy as np
import pytest

from retriever.rag import DPRag, PromptFormat, RagConfig
from synthgen.lm_backends import FlaxLM, TinyLM
from synthgen.models.llama import Llama, LlamaConfig

N = 12
MECHANISMS = ["icl", "keywords"]


class ByteTokenizer:  # ids 3.. are bytes
    vocab_size, eos_id, pad_id, bos_id, add_bos = 260, 1, 0, 2, True

    def encode(self, text):
        return [3 + b for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


@pytest.fixture(scope="module")
def lm():
    config = dataclasses.replace(LlamaConfig.tiny(), vocab_size=260, max_seq_len=512)
    params = Llama(config).init(jax.random.key(0), np.zeros((1, 4), np.int32))["params"]
    return FlaxLM(config, params, ByteTokenizer())


TEXTS = [f"rec {i}: {'fever ' * (i % 4)}rash" for i in range(N)]


def _rag(lm, config, texts=TEXTS, **kwargs):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(N, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return DPRag(
        [f"d{i}" for i in range(N)],
        texts,
        emb,
        lambda qs: emb[:1],
        lm,
        config=config,
        prompt=PromptFormat(chat=False),
        rng=np.random.default_rng(7),
        **kwargs,
    )


CONFIG = RagConfig(k=4, max_voters=6, max_tokens=3, max_document_tokens=16)


def test_cached_rows_give_the_whole_prompts_log_probabilities(lm):
    cached = _rag(lm, CONFIG, document_cache=True)
    indices, weights = np.array([3, 0, 7, 11, 5, 2]), np.array([1, 1, 1, 0, 1, 0.0])
    rows = cached._rows("which disease?", indices, weights)
    assert rows.documents is not None
    uncached = dataclasses.replace(rows, documents=None)
    got, want = rows.start(lm, 3), uncached.start(lm.fork(), 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not np.allclose(got[0], got[1], atol=1e-4)  # the documents matter


class Recorder:
    """Records what the private rows' session returns (start or start_documents, then
    every append) on one LM handle."""

    def __init__(self, lm, monkeypatch):
        self.calls, self.steps = [], []
        for name in ("start", "start_documents", "append"):
            monkeypatch.setattr(lm, name, self._wrap(name, getattr(lm, name)))

    def _wrap(self, name, method):
        def recorded(*args, **kwargs):
            out = method(*args, **kwargs)
            self.calls.append(name)
            self.steps.append(np.array(out))
            return out

        return recorded


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_cached_answers_equal_uncached_answers_step_by_step(lm, mechanism, monkeypatch):
    """The cached path is taken, and every private log-probability it produces equals the
    whole prompts' (so the released text is equal too); documents moved them."""
    cached = _rag(lm, CONFIG, document_cache=True)
    plain = _rag(lm.fork(), CONFIG)  # the same weights, a handle of its own to record
    texts = []
    for question in ("which disease?", "what does rec 3 have"):
        got, want = Recorder(cached.lm, monkeypatch), Recorder(plain.lm, monkeypatch)
        a = cached.answer(question, tenant="t", mechanism=mechanism, epsilon=50.0)
        b = plain.answer(question, tenant="t", mechanism=mechanism, epsilon=50.0)
        assert got.calls[0] == "start_documents" and want.calls[0] == "start"
        assert len(got.steps) == len(want.steps)
        for g, w in zip(got.steps, want.steps, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        first = got.steps[0]
        assert not np.allclose(first[0], first[1], atol=1e-4)  # rows differ: documents
        assert (a.text, a.abstained, a.paid_tokens) == (b.text, b.abstained, b.paid_tokens)
        texts.append(a.text)
    assert any(texts), "every answer empty: the comparison would be vacuous"


def test_another_width_runs_the_whole_prompts_and_an_lm_without_keys_is_refused(lm):
    cached = _rag(lm, CONFIG, document_cache=True)
    wider = cached.with_config(dataclasses.replace(CONFIG, max_document_tokens=20))
    rows = wider._rows("q", np.arange(6), np.ones(6))
    assert rows.documents is None
    assert cached._rows("q", np.arange(6), np.ones(6)).documents is not None
    with pytest.raises(ValueError, match="document_kv"):
        _rag(TinyLM(), CONFIG, document_cache=True)


def test_keys_are_shared_between_rags_of_one_collection_and_checked(lm):
    first = _rag(lm, CONFIG, document_cache=True)
    second = _rag(lm, CONFIG, document_cache=first.document_kv)
    assert second.document_kv is first.document_kv
    narrower = dataclasses.replace(CONFIG, max_document_tokens=8)
    with pytest.raises(ValueError, match="keys of other documents"):
        _rag(lm, narrower, document_cache=first.document_kv)
    # same lengths, other texts: the digest of the token ids tells them apart
    other = [t.replace("rash", "rasp") for t in TEXTS]
    with pytest.raises(ValueError, match="keys of other documents"):
        _rag(lm, CONFIG, texts=other, document_cache=first.document_kv)
    assert "params" not in repr(first.document_kv)  # nothing private in its repr
    assert _rag(lm, CONFIG).document_kv is None

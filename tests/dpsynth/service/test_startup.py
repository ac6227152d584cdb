"""What `retriever serve` refuses before it serves: the private corpus passed as the public
one, an answer event other than the one the collection pinned, δ caps of 1/n or more."""

import json
import re
import shutil

import numpy as np
import pytest

from dpsynth.service.app import ServiceConfig
from dpsynth.service.server import load_service
from retriever.index import ExactSearcher
from retriever.index_folder import corpus_digest, save_index_folder
from retriever.rag import RagConfig
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope

N = 20


class _Encoder:
    def encode(self, texts, **_):
        return np.ones((len(texts), 8), np.float32) / np.sqrt(8)


@pytest.fixture
def towers(monkeypatch):
    """`load_towers` replaced (no real encoder loads); the list of its calls."""
    import retriever.evaluate

    calls = []
    monkeypatch.setattr(
        retriever.evaluate, "load_towers", lambda e: calls.append(e) or (_Encoder(), _Encoder())
    )
    return calls


def _corpus(folder, name, prefix):
    rng = np.random.default_rng(len(prefix))
    emb = rng.normal(size=(N, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ids = [f"{prefix}{i}" for i in range(N)]
    texts = [f"{d} text" for d in ids]
    corpus = folder / f"{name}.jsonl"
    corpus.write_text(
        "".join(json.dumps({"doc_id": d, "text": t}) + "\n" for d, t in zip(ids, texts))
    )
    save_index_folder(folder / f"{name}-index", ExactSearcher(emb), encoder="all-minilm-l6-v2",
                      doc_ids=ids, digest=corpus_digest(ids, texts))  # fmt: skip
    return folder / f"{name}-index", corpus


@pytest.fixture
def world(tmp_path):
    private_index, private = _corpus(tmp_path, "corpus", "p")
    public_index, public = _corpus(tmp_path, "public", "q")
    ledger = str(tmp_path / "ledger.sqlite")
    book = PrivacyLedger(ledger)
    book.open_scope(Scope(COLLECTION, "corpus", 10.0, 1e-5))
    book.open_scope(Scope("alice", "corpus", 5.0, 1e-5))
    return dict(index=private_index, corpus=private, public_index=public_index, public=public,
                ledger=ledger, book=book)  # fmt: skip


def _load(world, *, epsilon=1.0, public_index=None, public_corpus=None, **rag):
    rag = {"k": 4, "max_tokens": 3, **rag}
    return load_service(
        world["index"],
        world["corpus"],
        ledger=world["ledger"],
        lm="tiny",
        rag_config=RagConfig(**rag),
        config=ServiceConfig(answer_epsilon=epsilon, mechanism="icl"),
        public_index=public_index,
        public_corpus=public_corpus,
    )


def test_the_private_corpus_is_refused_as_the_public_one(world, tmp_path, towers):
    copy = tmp_path / "renamed.jsonl"
    shutil.copyfile(world["corpus"], copy)  # same bytes, another name
    for corpus in (world["corpus"], copy):
        with pytest.raises(ValueError, match="--public-corpus is the private corpus"):
            _load(world, public_index=world["public_index"], public_corpus=corpus)
    with pytest.raises(ValueError, match="--public-index is the private index"):
        _load(world, public_index=world["index"], public_corpus=world["public"])
    assert towers == [] and world["book"].event_shape(COLLECTION, "corpus") is None
    service = _load(world, public_index=world["public_index"], public_corpus=world["public"])
    assert service.public is not None


def test_a_copy_of_the_private_index_is_refused_with_a_redacted_corpus(world, tmp_path, towers):
    """A copied private index served with a public corpus that reuses the private doc_ids
    (a redacted export): refused by the index's recorded corpus digest, not by paths."""
    copy = tmp_path / "copied-index"
    shutil.copytree(world["index"], copy)
    redacted = tmp_path / "redacted.jsonl"
    rows = [json.loads(line) for line in world["corpus"].read_text().splitlines()]
    redacted.write_text("".join(json.dumps({**r, "text": "[redacted]"}) + "\n" for r in rows))
    with pytest.raises(ValueError, match="--public-index is the private index"):
        _load(world, public_index=copy, public_corpus=redacted)
    from dpsynth.service.public_index import PublicIndex

    with pytest.raises(ValueError, match="its texts differ"):
        PublicIndex(copy, redacted)  # the public index's own check, whatever the private one
    rewritten = tmp_path / "rewritten.jsonl"  # the private rows, other bytes
    rewritten.write_text(
        "".join(json.dumps(r, indent=None, separators=(",", ":")) + "\n" for r in rows)
    )
    with pytest.raises(ValueError, match="--public-corpus is the private corpus"):
        _load(world, public_index=world["public_index"], public_corpus=rewritten)
    meta = json.loads((copy / "index.json").read_text())
    del meta["corpus_digest"]  # an index written before indexes recorded their digest
    (copy / "index.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="--public-index is the private index"):
        _load(world, public_index=copy, public_corpus=redacted)
    assert towers == []


def test_a_service_pins_its_answer_event_and_another_is_refused(world, towers):
    _load(world, epsilon=1.0)
    pinned = world["book"].event_shape(COLLECTION, "corpus")
    assert json.loads(pinned)["epsilon"] == 1.0
    _load(world, epsilon=1.0)  # a second replica with the same settings
    loads = len(towers)
    for other in ({"epsilon": 2.0}, {"epsilon": 1.0, "max_tokens": 6}):
        with pytest.raises(ValueError, match="already answers with another event"):
            _load(world, **other)
    assert len(towers) == loads  # refused before loading anything
    assert world["book"].event_shape(COLLECTION, "corpus") == pinned


@pytest.mark.parametrize(
    ("scope", "named"),
    [
        (Scope(COLLECTION, "corpus", 10.0, 0.05), "collection cap of corpus"),
        (Scope("bob", "corpus", 5.0, 0.5), "scope (bob, corpus)"),
    ],
)
def test_a_delta_cap_at_or_above_one_over_n_is_refused(world, tmp_path, towers, scope, named):
    book = PrivacyLedger(tmp_path / "caps.sqlite")
    book.open_scope(Scope(COLLECTION, "corpus", 10.0, 1e-5) if not scope.is_collection else scope)
    if not scope.is_collection:
        book.open_scope(scope)
    with pytest.raises(ValueError, match=re.escape(named) + f".*n={N} documents"):
        _load({**world, "ledger": str(tmp_path / "caps.sqlite")})
    assert book.event_shape(COLLECTION, "corpus") is None


def test_a_per_answer_delta_at_or_above_one_over_n_is_refused(world, towers):
    with pytest.raises(ValueError, match=rf"per-answer delta.*n={N}"):
        _load(world, delta=0.1)
    assert world["book"].event_shape(COLLECTION, "corpus") is None


def test_replicas_share_one_store_of_released_answers(world, towers):
    """--reuse-answers tenant: every replica hands out what any replica released; shared
    is refused under collection accounting before anything loads."""
    with pytest.raises(ValueError, match="shared needs --accounting individual"):
        load_service(
            world["index"], world["corpus"], ledger=world["ledger"], lm="tiny",
            rag_config=RagConfig(k=4, max_tokens=3), reuse_answers="shared",
            config=ServiceConfig(answer_epsilon=1.0, mechanism="icl"),
        )  # fmt: skip
    service = load_service(
        world["index"], world["corpus"], ledger=world["ledger"], lm="tiny", replicas=2,
        rag_config=RagConfig(k=4, max_tokens=3), reuse_answers="tenant",
        config=ServiceConfig(answer_epsilon=1.0, mechanism="icl"),
    )  # fmt: skip
    first, second = service.replicas
    assert first.answers is second.answers and first.answers.scope == "tenant"

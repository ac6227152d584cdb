"""The plain formats: export of the wiki corpus, and reading corpora, queries and pairs."""

import json

import pytest

from retriever import data


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_export_wiki_split_by_document(tmp_path):
    counts = data.export_wiki(tmp_path, limit=200, test_fraction=0.25, seed=3)
    corpus = _read(tmp_path / "corpus.jsonl")
    train, test = _read(tmp_path / "train_queries.jsonl"), _read(tmp_path / "test_queries.jsonl")
    assert counts == {"documents": 200, "train_queries": 150, "test_queries": 50}
    ids = {d["doc_id"] for d in corpus}
    assert {q["doc_id"] for q in train} | {q["doc_id"] for q in test} == ids
    assert not {q["doc_id"] for q in train} & {q["doc_id"] for q in test}
    # Same seed, same split.
    data.export_wiki(tmp_path / "again", limit=200, test_fraction=0.25, seed=3)
    assert _read(tmp_path / "again" / "test_queries.jsonl") == test


def test_generator_split_is_the_retriever_split(tmp_path):
    # The query generator trains on corpora.select_split(..., "train"); the retriever
    # evaluates on test_queries.jsonl. They must be the same split, so no test query leaks.
    from synthgen import corpora

    data.export_wiki(tmp_path, limit=120)
    ds = corpora.load_wiki_summaries(limit=120)
    test = _read(tmp_path / "test_queries.jsonl")
    assert corpora.select_split(ds, "test")["doc_id"] == [q["doc_id"] for q in test]
    train_ids = set(corpora.select_split(ds, "train")["doc_id"])
    assert train_ids.isdisjoint(q["doc_id"] for q in test)
    assert len(train_ids) + len(test) == 120


def _write(path, rows):
    data.write_jsonl(path, rows)
    return path


def test_read_pairs_of_a_generator_output_needs_no_corpus(tmp_path):
    pairs = _write(
        tmp_path / "queries.jsonl",
        [
            {"doc_id": 7, "document": "seven", "query": "q7"},
            {"doc_id": 11, "document": "eleven", "query": "q11"},
            {"doc_id": 9, "document": "nine", "query": "q9"},
        ],
    )
    assert data.read_pairs(pairs) == (
        ["q7", "q11", "q9"],
        ["seven", "eleven", "nine"],
        ["7", "11", "9"],
    )
    assert data.read_pairs(pairs, limit=2) == (["q7", "q11"], ["seven", "eleven"], ["7", "11"])


def test_read_pairs_joins_plain_queries_with_the_corpus(tmp_path):
    corpus = _write(
        tmp_path / "corpus.jsonl",
        [{"doc_id": "a", "text": "alpha"}, {"doc_id": "b", "text": "beta"}],
    )
    plain = _write(
        tmp_path / "train.jsonl", [{"query": "qb", "doc_id": "b"}, {"query": "qa", "doc_id": "a"}]
    )
    assert data.read_pairs(plain, corpus) == (["qb", "qa"], ["beta", "alpha"], ["b", "a"])
    with pytest.raises(ValueError, match="no document field: pass --corpus"):
        data.read_pairs(plain)
    stray = _write(tmp_path / "stray.jsonl", [{"query": "qz", "doc_id": "z"}])
    with pytest.raises(ValueError, match="1 pairs name a doc_id that is not in"):
        data.read_pairs(stray, corpus)


def test_read_corpus_refuses_repeated_doc_ids(tmp_path):
    corpus = _write(
        tmp_path / "corpus.jsonl", [{"doc_id": 1, "text": "a"}, {"doc_id": 1, "text": "b"}]
    )
    with pytest.raises(ValueError, match="repeats doc_ids"):
        data.read_corpus(corpus)

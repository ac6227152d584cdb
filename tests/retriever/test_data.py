"""Plain-format export of the wiki corpus."""

import json

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

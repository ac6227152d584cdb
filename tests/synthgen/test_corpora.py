"""Corpus loaders on the real offline assets."""

import json

import datasets
import pytest

from synthgen import assets, corpora


def test_wiki_summaries():
    ds = corpora.load_wiki_summaries()
    assert isinstance(ds, datasets.Dataset)
    assert ds.column_names == ["doc_id", "title", "document", "query", "topic"]
    assert 9000 < len(ds) <= 10_033
    assert len(set(ds["topic"])) == 12
    assert len(set(ds["doc_id"])) == len(ds)
    assert all(ds["query"]) and all(ds["document"])


def test_wiki_from_local_path_and_limit():
    path = assets.resolve("wiki-summaries-en")
    a = corpora.load_wiki_summaries(path, limit=50)
    b = corpora.load_wiki_summaries(path.parent, limit=50)
    assert len(a) == 50 and a["doc_id"] == b["doc_id"]


def test_chatterbot():
    ds = corpora.load_chatterbot()
    assert ds.column_names == ["category", "question", "answer"]
    assert len(ds) > 300
    assert "ai" in set(ds["category"])


def test_jsonl_errors_name_the_line_not_the_content(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"query": "secret text"}) + "\n")
    with pytest.raises(ValueError) as info:
        corpora.load_jsonl(path, required=("query", "doc_id"))
    assert ":1 lacks" in str(info.value) and "secret" not in str(info.value)
    path.write_text("")
    with pytest.raises(ValueError, match="no records"):
        corpora.load_jsonl(path)
    with pytest.raises(FileNotFoundError):
        corpora.load_jsonl(tmp_path / "missing.jsonl")
    path.write_text('"secret text"\n')  # a JSON string: `in` would test substrings
    with pytest.raises(ValueError, match=":1: not a JSON object"):
        corpora.load_jsonl(path, required=("query",))
    path.write_text('{"query": 12}\n{"query": "secret text"}\n')  # Arrow's error quotes it
    with pytest.raises(ValueError, match=r"\['query'\] hold values") as info:
        corpora.load_jsonl(path, required=("query",))
    assert "secret" not in str(info.value) and info.value.__suppress_context__
    path.write_bytes(b'{"query": "ok"}\n{"query": "caf\xe9 secret"}\n')  # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=":2: not UTF-8") as info:
        corpora.load_jsonl(path, required=("query",))
    assert "secret" not in str(info.value)
    path.write_bytes(b'{"query": "a", "n": null}\r{"query": "b", "n": 1}\r')  # old Mac lines
    assert corpora.load_jsonl(path, required=("query",))["n"] == [None, 1]

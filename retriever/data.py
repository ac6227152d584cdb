"""Retrieval datasets in the plain formats every `retriever` command reads.

* corpus.jsonl: one ``{"doc_id": ..., "text": ...}`` per line;
* queries.jsonl: one ``{"query": ..., "doc_id": ...}`` per line (one relevant document per
  line; several lines may share a query).

`export_wiki` splits the wiki summaries by document into train and test query files with a
fixed seed; every document, train or test, stays in the corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

from synthgen import corpora


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Writes `rows` as JSON lines (UTF-8, one object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def export_wiki(
    out_dir: str | Path,
    *,
    source: str = "wiki-summaries-en",
    test_fraction: float = 0.2,
    seed: int = 0,
    limit: int | None = None,
) -> dict[str, int]:
    """Writes corpus.jsonl, train_queries.jsonl and test_queries.jsonl for the wiki corpus.

    Args:
      out_dir: output folder (created).
      source: asset name or local path of the wiki summaries.
      test_fraction: share of documents whose queries are held out.
      seed: split seed (a public choice, not DP randomness).
      limit: use only the first `limit` documents.

    Returns:
      Counts of documents, train and test queries.
    """
    ds = corpora.load_wiki_summaries(source, limit=limit)
    train, test = corpora.split_by_document(ds, test_fraction=test_fraction, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = [
        {"doc_id": r["doc_id"], "text": r["document"], "title": r["title"], "topic": r["topic"]}
        for r in ds
    ]
    train_q = [{"query": r["query"], "doc_id": r["doc_id"]} for r in train]
    test_q = [{"query": r["query"], "doc_id": r["doc_id"]} for r in test]
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "train_queries.jsonl", train_q)
    write_jsonl(out / "test_queries.jsonl", test_q)
    return {"documents": len(corpus), "train_queries": len(train_q), "test_queries": len(test_q)}

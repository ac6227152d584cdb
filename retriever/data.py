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

import numpy as np

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
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction=}")
    ds = corpora.load_wiki_summaries(source, limit=limit)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(seed).permutation(len(ds))
    test = set(order[: max(1, int(round(test_fraction * len(ds))))].tolist())
    corpus, train_q, test_q = [], [], []
    for i, row in enumerate(ds):
        corpus.append(
            {
                "doc_id": row["doc_id"],
                "text": row["document"],
                "title": row["title"],
                "topic": row["topic"],
            }
        )
        (test_q if i in test else train_q).append({"query": row["query"], "doc_id": row["doc_id"]})
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "train_queries.jsonl", train_q)
    write_jsonl(out / "test_queries.jsonl", test_q)
    return {"documents": len(corpus), "train_queries": len(train_q), "test_queries": len(test_q)}

"""Retrieval datasets in the plain formats every `retriever` command reads.

* corpus.jsonl: one ``{"doc_id": ..., "text": ...}`` per line;
* queries.jsonl: one ``{"query": ..., "doc_id": ...}`` per line (one relevant document per
  line; several lines may share a query).

`export_wiki` splits the wiki summaries by document into train and test query files with a
fixed seed; every document, train or test, stays in the corpus. `read_corpus`,
`read_queries` and `read_pairs` read the files back.
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


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """(doc_ids, texts) of a corpus.jsonl; duplicate doc_ids are an error."""
    ds = corpora.load_jsonl(path, required=("doc_id", "text"))
    doc_ids = [str(d) for d in ds["doc_id"]]
    if len(set(doc_ids)) != len(doc_ids):
        raise ValueError(f"{path} repeats doc_ids")
    return doc_ids, list(ds["text"])


def read_queries(path: str | Path) -> list[dict]:
    """Rows {"query", "doc_id"} of a queries.jsonl."""
    return corpora.load_jsonl(path, required=("query", "doc_id")).to_list()


def read_pairs(
    pairs: str | Path, corpus: str | Path | None = None, limit: int | None = None
) -> tuple[list[str], list[str], list[str]]:
    """(queries, documents, doc_ids) of training pairs, one entry per line of `pairs`.

    Args:
      pairs: a query generator's output (lines with doc_id, document and query) or a plain
        queries.jsonl (query, doc_id), whose documents are looked up in `corpus`.
      corpus: corpus.jsonl (doc_id, text); needed when `pairs` has no document field.
      limit: the first `limit` lines only.

    Returns:
      The query texts, their documents' texts and their doc_ids.

    Raises:
      ValueError: plain pairs without `corpus`, or pairs naming a doc_id not in `corpus`.
    """
    rows = corpora.load_jsonl(pairs, required=("query", "doc_id")).to_list()
    if limit:
        rows = rows[:limit]
    if all("document" in r for r in rows):
        return (
            [r["query"] for r in rows],
            [r["document"] for r in rows],
            [str(r["doc_id"]) for r in rows],
        )
    if corpus is None:
        raise ValueError(f"{pairs} has no document field: pass --corpus corpus.jsonl")
    doc_ids, texts = read_corpus(corpus)
    text_of = dict(zip(doc_ids, texts))
    missing = sum(1 for r in rows if str(r["doc_id"]) not in text_of)
    if missing:
        raise ValueError(f"{missing} pairs name a doc_id that is not in {corpus}")
    return (
        [r["query"] for r in rows],
        [text_of[str(r["doc_id"])] for r in rows],
        [str(r["doc_id"]) for r in rows],
    )


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

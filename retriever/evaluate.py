"""Retrieval evaluation on plain files: NDCG@10, Recall@10, MRR@10 with exact or ScaNN search.

corpus.jsonl: one ``{"doc_id": ..., "text": ...}`` per line; queries.jsonl: one
``{"query": ..., "doc_id": ...}`` per line (lines sharing a query are one query with several
relevant documents). Reports are JSON-serialisable dicts; nothing in them is text. A report
names the encoder it evaluated (the resolved folder, or the asset name), its base model and
the encoder's privacy statement (`retriever.provenance`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from retriever import metrics
from retriever.encoders import DOC_TOWER_DIR, TextEncoder, load_encoder
from retriever.index import build_searcher
from retriever.provenance import encoder_provenance


def load_towers(encoder: str | TextEncoder) -> tuple[TextEncoder, TextEncoder]:
    """(query encoder, document encoder): the same unless `encoder` is a trained folder
    with a separate document tower."""
    if isinstance(encoder, TextEncoder):
        return encoder, encoder
    query = load_encoder(encoder)
    doc_dir = Path(encoder) / DOC_TOWER_DIR
    return query, (load_encoder(str(doc_dir)) if doc_dir.is_dir() else query)


def encoder_label(encoder: str | Path | TextEncoder) -> str:
    """How a report names an encoder: its resolved folder, else the asset or model name."""
    if isinstance(encoder, TextEncoder):
        return encoder.name
    path = Path(encoder).expanduser()
    return str(path.resolve()) if path.is_dir() else str(encoder)


def evaluate(
    encoder: str | TextEncoder,
    doc_ids: list[str],
    texts: list[str],
    query_rows: list[dict],
    *,
    index: str = "exact",
    k: int = 10,
    max_query_len: int = 32,
    max_doc_len: int = 128,
    batch_size: int = 64,
    progress: bool = True,
    per_query: bool = False,
) -> dict:
    """Encodes corpus and queries, searches the top k, and scores the rankings.

    Returns:
      The metrics (`retriever.metrics.ranking_metrics`; with `per_query`, each query's too),
      counts, the index kind, timings, ``encoder`` (`encoder_label`: the folder evaluated),
      ``base`` (its base model) and ``statement`` (its privacy statement; None for a
      `TextEncoder` object).

    Raises:
      ValueError: a query's relevant doc_id is not in the corpus.
    """
    known = set(doc_ids)
    missing = sum(1 for r in query_rows if str(r["doc_id"]) not in known)
    if missing:
        raise ValueError(f"{missing} query lines name a doc_id that is not in the corpus")
    query_enc, doc_enc = load_towers(encoder)
    queries, relevant = metrics.group_queries(query_rows)
    start = time.time()
    doc_emb = doc_enc.encode(texts, batch_size=batch_size, max_len=max_doc_len, progress=progress)
    query_emb = query_enc.encode(
        queries, batch_size=batch_size, max_len=max_query_len, progress=progress
    )
    encoded = time.time()
    searcher = build_searcher(doc_emb, kind=index)
    _, found = searcher.search(np.asarray(query_emb, np.float32), k)
    rankings = [[doc_ids[i] for i in row if i >= 0] for row in found]
    report = metrics.ranking_metrics(rankings, relevant, k=k, per_query=per_query)
    report.update(
        num_documents=len(doc_ids),
        num_query_lines=len(query_rows),
        index=searcher.kind,
        encoder=encoder_label(encoder),
        base=query_enc.name,
        statement=None
        if isinstance(encoder, TextEncoder)  # an object in memory: its training is unknown
        else encoder_provenance(encoder)["statement"],
        encode_seconds=encoded - start,
        search_seconds=time.time() - encoded,
    )
    return report

"""`retriever evaluate`: NDCG, Recall and MRR of an encoder (wrapper over `retriever.evaluate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from synthgen.command_line import JsonOption, choice


def evaluate(
    encoder: Annotated[str, typer.Option(help="asset, encoder folder or trained checkpoint")],
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl: doc_id, text")],
    queries: Annotated[Path, typer.Option(help="queries.jsonl: query, doc_id")],
    index: Annotated[
        str,
        choice("exact", "scann", "scann-bf", help="the search: exact, ScaNN, or ScaNN brute force"),
    ] = "exact",
    k: Annotated[int, typer.Option(help="cut-off of the metrics")] = 10,
    as_json: JsonOption = False,
    out: Annotated[Path | None, typer.Option(help="also write the report here")] = None,
) -> None:
    """NDCG@k, Recall@k and MRR@k of an encoder on held-out (query, document) pairs."""
    from retriever import evaluate as ev
    from retriever.data import read_corpus, read_queries

    doc_ids, texts = read_corpus(corpus)
    report = ev.evaluate(encoder, doc_ids, texts, read_queries(queries), index=index, k=k)
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    if as_json:
        print(json.dumps(report))
    else:
        print(
            " ".join(
                f"{name}={report[name]:.4f}" for name in (f"ndcg@{k}", f"recall@{k}", f"mrr@{k}")
            )
            + f" (queries={report['num_queries']}, documents={report['num_documents']}, "
            f"index={report['index']}, encoder={report['encoder']})"
        )

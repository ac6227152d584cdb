"""`retriever index build|query|export`: thin wrappers over `retriever.index_folder` and
`retriever.export`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

index_app = typer.Typer(help="Build and query a nearest-neighbour index.", no_args_is_help=True)


@index_app.command("build")
def index_build(
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl: doc_id, text")],
    out: Annotated[Path, typer.Option(help="index folder")],
    encoder: Annotated[str, typer.Option(help="asset or trained folder")] = "all-minilm-l6-v2",
    kind: Annotated[str, typer.Option(help="auto | exact | scann | scann-bf")] = "auto",
) -> None:
    """Embed a corpus (batched, jitted) and build a searchable, serialised index."""
    from retriever.index_folder import build_index_folder

    searcher = build_index_folder(corpus, out, encoder=encoder, kind=kind, progress=True)
    print(json.dumps({"out": str(out), "documents": searcher.size, "kind": searcher.kind}))


@index_app.command("query")
def index_query(
    index: Annotated[Path, typer.Option(help="folder written by `index build`")],
    query: Annotated[list[str], typer.Option(help="query text (repeatable)")],
    k: Annotated[int, typer.Option()] = 10,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Top-k documents of each query from a built index."""
    from retriever.index_folder import search_index_folder

    results = search_index_folder(index, query, k)
    if as_json:
        print(json.dumps([{"query": q, "results": r} for q, r in zip(query, results)]))
        return
    for q, r in zip(query, results):
        print(q)
        for rank, hit in enumerate(r, start=1):
            print(f"  {rank:2d}. {hit['doc_id']}  {hit['score']:.4f}")


@index_app.command("export")
def index_export(
    index: Annotated[Path, typer.Option(help="folder written by `index build`")],
    out: Annotated[Path, typer.Option(help="output file (new)")],
    format: Annotated[str, typer.Option(help="parquet")] = "parquet",  # noqa: A002
) -> None:
    """Write (doc_id, embedding) rows for a vector database, with the encoder's provenance."""
    from retriever.export import export_index

    print(json.dumps(export_index(index, out, format=format)))

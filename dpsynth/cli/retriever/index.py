"""`retriever index build|merge|query|export`: thin wrappers over `retriever.index_folder` and
`retriever.export`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import group_app
from synthgen.command_line import JsonFlagOption, choice, usage_errors

index_app = group_app("Build and query a nearest-neighbour index.")


IndexKindOption = Annotated[
    str,
    choice(
        "auto", "exact", "scann", "scann-bf",
        help="the search: exact, ScaNN or ScaNN brute force (auto: by size)",
    ),
]  # fmt: skip
IndexFolderOption = Annotated[Path, typer.Option(help="index folder")]
BuiltIndexOption = Annotated[Path, typer.Option(help="folder written by `index build`")]


@index_app.command("build")
def index_build(
    corpus: Annotated[
        Path, typer.Option(help="corpus.jsonl: doc_id, text", exists=True, dir_okay=False)
    ],
    out: IndexFolderOption,
    encoder: Annotated[str, typer.Option(help="asset or trained folder")] = "all-minilm-l6-v2",
    kind: IndexKindOption = "auto",
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: embed shard I of N into --out (join with `index merge`, which takes --kind)"
        ),
    ] = None,
) -> None:
    """Embed a corpus (batched, jitted) and build a searchable, serialised index.

    index.json records the encoder's absolute folder (or asset name) and a copy of its
    provenance. Every option is checked before the corpus is embedded (usage errors: exit 2).
    With --shard I/N, only that shard's embeddings are written; `index merge` builds the
    index from the N shard folders (the same files as one unsharded build).
    """
    from retriever.encoders import RANDOM_PREFIX
    from retriever.index_folder import build_index_folder, check_kind
    from synthgen import assets

    with usage_errors(ValueError, option="--kind"):
        check_kind(kind)
    known = encoder.startswith(RANDOM_PREFIX) or encoder in assets.REGISTRY
    if not known and not Path(encoder).expanduser().is_dir():
        raise typer.BadParameter(
            f"no encoder folder or known asset named {encoder!r}", param_hint="--encoder"
        )
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} is a file, not a folder", param_hint="--out")
    if shard is not None:
        from retriever.index_shards import encode_index_shard
        from synthgen.command_line import parse_shard

        part = parse_shard(shard)
        count = encode_index_shard(corpus, out, shard=part, encoder=encoder, progress=True)
        print(json.dumps({"out": str(out), "shard": str(part), "documents": count}))
        return
    searcher = build_index_folder(corpus, out, encoder=encoder, kind=kind, progress=True)
    print(json.dumps({"out": str(out), "documents": searcher.size, "kind": searcher.kind}))


@index_app.command("merge")
def index_merge(
    shards: Annotated[list[Path], typer.Argument(help="the shard folders of one build")],
    out: IndexFolderOption,
    kind: IndexKindOption = "auto",
) -> None:
    """Build the index from the folders of `index build --shard I/N` (all N of them)."""
    from retriever.index_shards import merge_index_shards

    searcher = merge_index_shards(shards, out, kind=kind)
    print(json.dumps({"out": str(out), "documents": searcher.size, "kind": searcher.kind}))


@index_app.command("query")
def index_query(
    index: BuiltIndexOption,
    query: Annotated[list[str], typer.Option(help="query text (repeatable)")],
    k: int = 10,
    as_json: JsonFlagOption = False,
    encoder: Annotated[
        str | None,
        typer.Option(help="the index's encoder where its folder moved (provenance checked)"),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(help="the indexed corpus.jsonl: print each hit's text (a snippet)"),
    ] = None,
) -> None:
    """Top-k documents of each query from a built index."""
    from retriever.index_folder import search_index_folder

    texts = None
    if corpus is not None:
        from retriever.data import read_corpus

        texts = dict(zip(*read_corpus(corpus), strict=True))
    results = search_index_folder(index, query, k, encoder=encoder)
    if texts is not None:
        for hits in results:
            for hit in hits:
                hit["text"] = texts.get(hit["doc_id"], "")
    if as_json:
        print(json.dumps([{"query": q, "results": r} for q, r in zip(query, results)]))
        return
    for q, r in zip(query, results):
        print(q)
        for rank, hit in enumerate(r, start=1):
            line = f"  {rank:2d}. {hit['doc_id']}  {hit['score']:.4f}"
            if "text" in hit:
                text = " ".join(hit["text"].split())
                line += "  " + (text if len(text) <= 80 else text[:77] + "...")
            print(line)


@index_app.command("export")
def index_export(
    index: BuiltIndexOption,
    out: Annotated[Path, typer.Option(help="output file (new)")],
    format: Annotated[str, typer.Option(help="parquet")] = "parquet",  # noqa: A002
    encoder: Annotated[
        str | None,
        typer.Option(help="an old index's encoder where its folder moved (provenance checked)"),
    ] = None,
) -> None:
    """Write (doc_id, embedding) rows for a vector database, with the encoder's provenance."""
    from retriever.export import export_index

    print(json.dumps(export_index(index, out, format=format, encoder=encoder)))

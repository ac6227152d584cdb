"""`retriever data wiki`: prepare retrieval datasets in the plain JSONL formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

data_app = typer.Typer(
    help="Prepare retrieval datasets in the plain JSONL formats.", no_args_is_help=True
)


@data_app.command("wiki")
def data_wiki(
    out: Annotated[Path, typer.Option(help="output folder")],
    source: Annotated[str, typer.Option(help="asset name or path")] = "wiki-summaries-en",
    test_fraction: Annotated[float, typer.Option(help="held-out share of documents")] = 0.2,
    seed: Annotated[int, typer.Option(help="split seed")] = 0,
    limit: Annotated[int | None, typer.Option(help="first N documents only")] = None,
) -> None:
    """Write corpus.jsonl and train/test query files for the wiki summaries."""
    from retriever import data

    counts = data.export_wiki(
        out, source=source, test_fraction=test_fraction, seed=seed, limit=limit
    )
    print(json.dumps(counts))

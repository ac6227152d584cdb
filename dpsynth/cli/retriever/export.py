"""`retriever export`: a trained encoder as a sentence-transformers folder (`retriever.export`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer


def export(
    encoder: Annotated[Path, typer.Option(help="trained encoder folder (retriever train)")],
    out: Annotated[Path, typer.Option(help="export folder (new or empty)")],
    format: Annotated[  # noqa: A002 - the option is --format
        str, typer.Option(help="sentence-transformers (Hugging Face layout of the base)")
    ] = "sentence-transformers",
    evaluation: Annotated[
        Path | None,
        typer.Option(
            help="a `retriever evaluate --out` report of this encoder, for the card "
            "(not DP: for public evaluation queries only)"
        ),
    ] = None,
) -> None:
    """Export a trained encoder for sentence-transformers / transformers, with its provenance.

    The folder loads with SentenceTransformer(OUT) and transformers' AutoModel (BERT) or
    T5EncoderModel (T5); provenance.json and README.md state its privacy guarantee.
    """
    from retriever.export import export_encoder

    summary = export_encoder(encoder, out, format=format, evaluation=evaluation)
    if evaluation is not None:
        print("warning: the card's evaluation figures are not DP: ship it only if the "
              "evaluation queries may be published", file=sys.stderr)  # fmt: skip
    print(json.dumps(summary))  # JSON escapes ε and δ: safe in any locale

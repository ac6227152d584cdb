"""`retriever contributor build`: a thin wrapper over `retriever.network.knowledge`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from retriever.cli_options import (
    ClustersPerRecordOption,
    MaxClustersOption,
    MaxKeywordsOption,
    PublicPoolSizeOption,
    VotersOption,
)
from synthgen.command_line import positive, probability


def build(
    private: Annotated[Path, typer.Option(help="private corpus.jsonl (doc_id, text)")],
    epsilon: Annotated[
        float, typer.Option(help="epsilon of the whole release (paid once)", callback=positive)
    ],
    out: Annotated[Path, typer.Option(help="release folder (safe to ship)")],
    name: Annotated[
        str | None, typer.Option(help="contributor's public name (default: --out's name)")
    ] = None,
    delta: Annotated[
        float, typer.Option(help="delta of the whole release", callback=probability)
    ] = 1e-5,
    work: Annotated[
        Path | None,
        typer.Option(help="private work folder: ledger, keys, private index (never ship it)"),
    ] = None,
    ledger: Annotated[
        str | None, typer.Option(help="ledger file or URL (default: <work>/ledger.sqlite)")
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="collection name in the ledger")] = None,
    lm: Annotated[str, typer.Option(help="LM asset or path; 'tiny': the test LM")] = (
        "smollm2-135m-instruct"
    ),
    encoder: Annotated[str, typer.Option(help="encoder of the indexes")] = "all-minilm-l6-v2",
    keyword_share: Annotated[float, typer.Option(help="share of epsilon for keywords")] = 0.2,
    max_keywords: MaxKeywordsOption = 6,
    clusters_per_record: ClustersPerRecordOption = 2,
    max_clusters: MaxClustersOption = 64,
    voters: VotersOption = 64,
    public_pool_size: PublicPoolSizeOption = 128,
    answer_index: Annotated[
        bool, typer.Option(help="also index the private corpus for /answer (work folder)")
    ] = True,
    seed: Annotated[
        int | None, typer.Option(help="tests only: fixed seed (stated on the card)")
    ] = None,
) -> None:
    """Release a contributor's DP synthetic knowledge once: keywords, records, index, card."""
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.knowledge import KnowledgeConfig

    if seed is not None:
        print(
            "warning: --seed fixes the mechanisms' randomness: for tests only, not for "
            "publication (stated on the card)",
            file=sys.stderr,
        )
    config = KnowledgeConfig(
        epsilon=epsilon,
        delta=delta,
        keyword_share=keyword_share,
        max_keywords=max_keywords,
        clusters_per_record=clusters_per_record,
        max_clusters=max_clusters,
        voters=voters,
        public_pool_size=public_pool_size,
    )
    result = build_knowledge(
        private,
        out,
        config,
        contributor=name or out.name,
        work=work,
        ledger=ledger,
        dataset=dataset,
        lm=lm,
        encoder=encoder,
        answer_index=answer_index,
        seed=seed,
    )
    print(summary(result))

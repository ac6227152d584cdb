"""`retriever contributor build`: a thin wrapper over `retriever.network.knowledge`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from retriever.cli_options import (
    ClustersPerRecordOption,
    GuaranteesAddUpOption,
    MaxClustersOption,
    MaxKeywordsOption,
    PublicPoolSizeOption,
    VotersOption,
)
from synthgen.command_line import choice, positive, probability


def build(
    private: Annotated[Path, typer.Option(help="private corpus.jsonl (doc_id, text)")],
    epsilon: Annotated[
        float, typer.Option(help="epsilon of the whole release (paid once)", callback=positive)
    ],
    out: Annotated[Path, typer.Option(help="release folder (safe to ship)")],
    name: Annotated[
        str | None, typer.Option(help="contributor's public name (default: --out's name)")
    ] = None,
    mode: Annotated[
        str,
        choice(
            "facts",
            "clusters",
            help="facts: the key-phrase pairs many records state (DP set union), one record "
            "per released phrase; clusters: DP-SynRAG clusters and LM-generated records",
        ),
    ] = "facts",  # fmt: skip
    delta: Annotated[
        float | None,
        typer.Option(
            help="delta of the whole release, below 1/n (default: 1e-6 facts, 1e-5 clusters)",
            callback=probability,
        ),
    ] = None,
    max_pairs: Annotated[
        int, typer.Option(help="facts: K, fact pairs one record contributes", callback=positive)
    ] = 1,
    work: Annotated[
        Path | None,
        typer.Option(help="private work folder: ledger, keys, private index (never ship it)"),
    ] = None,
    ledger: Annotated[
        str | None, typer.Option(help="ledger file or URL (default: <work>/ledger.sqlite)")
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="collection name in the ledger")] = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    lm: Annotated[str, typer.Option(help="clusters: LM asset or path; 'tiny': the test LM")] = (
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
    """Release a contributor's DP synthetic knowledge once: records, index, card.

    facts (default): each record's fact pairs (key phrases stated together, by a public
    rule); the pairs many records state are released (PipelineDP partition selection) and
    written as one record per phrase, listing its released partners. clusters: DP keywords,
    clusters, LM-generated records (DP-SynRAG). One charge on the contributor's ledger before
    any noise; a release that could carry nothing is refused before the charge.
    """
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.knowledge import FactConfig, KnowledgeConfig

    if seed is not None and mode == "facts":
        print(
            "warning: --seed has no effect on a fact release (python-dp's secure noise)",
            file=sys.stderr,
        )
    elif seed is not None:
        print(
            "warning: --seed fixes the mechanisms' randomness: for tests only, not for "
            "publication (stated on the card)",
            file=sys.stderr,
        )
    if mode == "facts":
        config = FactConfig(epsilon=epsilon, delta=1e-6 if delta is None else delta,
                            max_pairs=max_pairs)  # fmt: skip
    else:
        config = KnowledgeConfig(
            epsilon=epsilon,
            delta=1e-5 if delta is None else delta,
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
        guarantees_add_up=guarantees_add_up,
    )
    print(summary(result))

"""`retriever contributor build`: a thin wrapper over `retriever.network.knowledge`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.retriever.options import (
    FactCorpusOption,
    GuaranteesAddUpOption,
    MaxPairsOption,
    ReleaseDatasetOption,
    ReleaseOutOption,
)
from synthgen.command_line import choice, positive, probability

EpsilonOption = Annotated[
    float, typer.Option(help="epsilon of the whole release (paid once)", callback=positive)
]
NameOption = Annotated[
    str | None, typer.Option(help="contributor's public name (default: --out's name)")
]
DeltaOption = Annotated[
    float, typer.Option(help="delta of the whole release, below 1/n", callback=probability)
]
ExtractorOption = Annotated[
    str,
    choice(
        "typed",
        "phrases",
        help="typed (a subject and its typed value) or phrases (pairs of key phrases, "
        "answered by the LM picking a partner)",
    ),
]
WorkOption = Annotated[
    Path | None,
    typer.Option(help="private work folder: ledger, keys, private index (never ship it)"),
]
LedgerOption = Annotated[
    str | None, typer.Option(help="ledger file or URL (default: <work>/ledger.sqlite)")
]
AnswerIndexOption = Annotated[
    bool, typer.Option(help="also index the private corpus for /answer (work folder)")
]


def build(
    private: FactCorpusOption,
    epsilon: EpsilonOption,
    out: ReleaseOutOption,
    name: NameOption = None,
    delta: DeltaOption = 1e-6,
    max_pairs: MaxPairsOption = 1,
    extractor: ExtractorOption = "typed",
    work: WorkOption = None,
    ledger: LedgerOption = None,
    dataset: ReleaseDatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    encoder: Annotated[str, typer.Option(help="encoder of the indexes")] = "all-minilm-l6-v2",
    answer_index: AnswerIndexOption = True,
) -> None:
    """Release a contributor's facts once: records, index, card.

    Each record's facts (a subject and its typed value, by a public rule); the facts many
    records state are released (PipelineDP partition selection) and written as one record
    per subject, listing its released values. One charge on the contributor's ledger before
    any noise; a release that could carry nothing is refused before the charge. (The
    cluster release, --mode clusters, was retired: see the knowledge guide.)
    """
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.knowledge import FactConfig

    config = FactConfig(epsilon=epsilon, delta=delta, max_pairs=max_pairs, extractor=extractor)
    result = build_knowledge(
        private,
        out,
        config,
        contributor=name or out.name,
        work=work,
        ledger=ledger,
        dataset=dataset,
        encoder=encoder,
        answer_index=answer_index,
        guarantees_add_up=guarantees_add_up,
    )
    print(summary(result))

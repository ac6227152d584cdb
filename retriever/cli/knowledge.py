"""`retriever knowledge release|answer`: release a collection once, then answer for free.

Thin wrappers over `retriever.network.knowledge.build_knowledge` (the one-time DP release,
`synthgen.knowledge`) and `retriever.knowledge_base.KnowledgeBase` (ordinary RAG over the
release, nothing charged).
"""

from __future__ import annotations

import json
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
from synthgen.command_line import (
    HelpGroup,
    LedgerOption,
    choice,
    parse_shard,
    positive,
    probability,
)

knowledge_app = typer.Typer(
    cls=HelpGroup,
    help="Release a private collection's knowledge once (DP-SynRAG); answer from it for free.",
    no_args_is_help=True,
)


@knowledge_app.command("release")
def release(
    private_corpus: Annotated[Path, typer.Option(help="private corpus.jsonl (doc_id, text)")],
    out: Annotated[Path, typer.Option(help="release folder (safe to ship)")],
    epsilon: Annotated[
        float, typer.Option(help="per-record epsilon of the whole release", callback=positive)
    ],
    delta: Annotated[
        float, typer.Option(help="delta of the whole release", callback=probability)
    ] = 1e-6,
    ledger: LedgerOption = None,
    dataset: Annotated[str | None, typer.Option(help="collection name in the ledger")] = None,
    work: Annotated[
        Path | None, typer.Option(help="private work folder (default: beside the ledger)")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: generate this shard's clusters; any run that finds all done "
            "writes the release"
        ),
    ] = None,  # fmt: skip
    lm: Annotated[str, typer.Option(help="public LM asset or path; 'tiny': the test LM")] = (
        "smollm2-135m-instruct"
    ),
    encoder: Annotated[str, typer.Option(help="public encoder of the index")] = (
        "all-minilm-l6-v2"
    ),
    max_keywords: MaxKeywordsOption = 6,
    clusters_per_record: ClustersPerRecordOption = 2,
    max_clusters: MaxClustersOption = 64,
    voters: VotersOption = 64,
    public_pool_size: PublicPoolSizeOption = 128,
    fields: Annotated[
        str,
        typer.Option(help="comma-separated fields a synthetic record states; '' for free text"),
    ] = "Diagnosis,Symptoms,Treatment",
    field_values: Annotated[str, typer.Option(help="comma-separated keywords per field")] = "1,2,1",
    field_examples: Annotated[
        Path | None,
        typer.Option(
            help="public worked examples for the field votes, a JSON list of "
            '{"record": TEXT, "values": [one per field]} (default: none; measured worse on '
            "the DP-RAG world, see synthgen.knowledge.config)"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the guarantee as JSON")] = False,
    seed: Annotated[
        int | None, typer.Option(help="tests only: fixed seed (stated on the card)")
    ] = None,
) -> None:
    """Release the collection's knowledge once: DP keywords, clusters, records, index, card.

    One charge on the ledger (tenant "release", the collection) before any noise; a second
    release of the same collection from the same ledger is refused. Every question after it
    is answered from the release at no further cost (`retriever knowledge answer`).
    """
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.knowledge import KnowledgeConfig

    if seed is not None:
        print("warning: --seed is for tests only (stated on the card)", file=sys.stderr)
    names = tuple(f.strip() for f in fields.split(",") if f.strip())
    counts = tuple(int(v) for v in field_values.split(",") if v.strip())[: len(names)]
    examples = ()
    if field_examples is not None:
        try:
            rows = json.loads(field_examples.read_text())
            examples = tuple((str(r["record"]), tuple(map(str, r["values"]))) for r in rows)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise typer.BadParameter(
                f"--field-examples: need a JSON list of {{record, values}} ({error})"
            ) from None
    config = KnowledgeConfig(
        epsilon=epsilon,
        delta=delta,
        max_keywords=max_keywords,
        clusters_per_record=clusters_per_record,
        max_clusters=max_clusters,
        voters=voters,
        public_pool_size=public_pool_size,
        fields=names,
        field_values=counts,
        field_examples=examples,
    )
    part = parse_shard(shard)
    result = build_knowledge(
        private_corpus,
        out,
        config,
        contributor=dataset or private_corpus.stem,
        work=work,
        ledger=ledger,
        dataset=dataset,
        lm=lm,
        encoder=encoder,
        answer_index=False,
        seed=seed,
        shard=(0, 1) if part is None else (part.index, part.count),
    )
    line = json.loads(summary(result))
    if as_json:
        print(json.dumps(line))
        return
    if line["complete"]:
        print(
            f"released {line['documents']} synthetic records from {line['clusters']} clusters "
            f"to {line['out']}: ({line['epsilon']:.4g}, {line['delta']:.3g})-DP per record"
        )
    else:
        print(f"shard done; other clusters remain ({line['clusters']} clusters in all)")


@knowledge_app.command("answer")
def answer(
    knowledge: Annotated[Path, typer.Option(help="a release folder (knowledge release)")],
    question: Annotated[str, typer.Option(help="the question")],
    lm: Annotated[str, typer.Option(help="public LM asset or path; 'tiny': the test LM")] = (
        "smollm2-135m-instruct"
    ),
    k: Annotated[
        int, typer.Option(help="synthetic records read per answer (SmolLM2-135M: 1 is best)")
    ] = 1,
    retrieval: Annotated[
        str,
        choice(
            "bm25", "dense", help="the records' words (BM25) or the release's index encoder (dense)"
        ),
    ] = "bm25",
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
) -> None:
    """Answer a question from a release: ordinary RAG, nothing charged."""
    from retriever.knowledge_base import RETRIEVALS, KnowledgeBase

    if retrieval not in RETRIEVALS:
        raise typer.BadParameter(f"--retrieval must be one of {', '.join(RETRIEVALS)}")
    base = KnowledgeBase.open(knowledge, lm=lm, k=k, retrieval=retrieval)
    result = base.answer(question).to_dict()
    if as_json:
        print(json.dumps(result))
        return
    print(result["answer"])
    print(f"(charged nothing: {result['statement']})", file=sys.stderr)

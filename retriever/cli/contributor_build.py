"""`retriever contributor build`: a thin wrapper over `retriever.network.knowledge`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

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
    topic_share: Annotated[float, typer.Option(help="share of epsilon for the topics")] = 0.3,
    max_keywords: Annotated[int, typer.Option(help="most keywords (pools) per document")] = 4,
    pools_per_document: Annotated[
        int, typer.Option(help="most topic pools a document joins (charged that many times)")
    ] = 1,
    max_topics: Annotated[int, typer.Option(help="most topics generated for")] = 64,
    per_topic: Annotated[int, typer.Option(help="synthetic documents per topic")] = 1,
    public_pool_size: Annotated[
        int, typer.Option(help="declared pool size N: sampling rate q = subsets*shots/N")
    ] = 32,
    subsets: Annotated[int, typer.Option(help="M prompts per token")] = 16,
    shots: Annotated[int, typer.Option(help="expected private documents per prompt")] = 1,
    max_new_tokens: Annotated[int, typer.Option(help="token limit of a document")] = 20,
    public_vocab: Annotated[int, typer.Option(help="RVP: top-K public candidates")] = 10,
    public_prior: Annotated[float, typer.Option(help="weight of the public prior")] = 1.0,
    answer_index: Annotated[
        bool, typer.Option(help="also index the private corpus for /answer (work folder)")
    ] = True,
    seed: Annotated[
        int | None, typer.Option(help="tests only: fixed seed (stated on the card)")
    ] = None,
) -> None:
    """Release a contributor's DP synthetic knowledge once: topics, documents, index, card."""
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.fewshot import FewShotConfig
    from synthgen.fewshot.topics import TopicConfig

    if seed is not None:
        print(
            "warning: --seed fixes the mechanisms' randomness: for tests only, not for "
            "publication (stated on the card)",
            file=sys.stderr,
        )
    config = TopicConfig(
        epsilon=epsilon,
        delta=delta,
        topic_share=topic_share,
        max_keywords=max_keywords,
        pools_per_document=pools_per_document,
        max_topics=max_topics,
        per_topic=per_topic,
        fewshot=FewShotConfig(
            public_pool_size=public_pool_size,
            subsets=subsets,
            shots=shots,
            max_new_tokens=max_new_tokens,
            public_vocab=public_vocab,
            public_prior=public_prior,
            resample="example",
            target_epsilon=epsilon,  # replaced by the plan's share
        ),
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

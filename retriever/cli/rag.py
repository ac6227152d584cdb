"""`retriever answer` and `retriever privacy rag`: thin wrappers over `retriever.rag`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from retriever.cli_options import (
    CollectionDeltaOption,
    CompositionOption,
    EncoderIndependentOption,
    IndexOption,
    MaxScoreOption,
    MaxTokensOption,
    MinScoreOption,
    PrivateCorpusOption,
)
from synthgen.command_line import LedgerOption, positive, probability

privacy_app = typer.Typer(help="Privacy calculators.", no_args_is_help=True)


@privacy_app.command("rag")
def privacy_rag(
    tokens: Annotated[int, typer.Option(help="most answer tokens T")],
    delta: Annotated[float, typer.Option(help="per-answer delta")],
    target_epsilon: Annotated[float, typer.Option(help="per-answer epsilon")],
    mechanism: Annotated[str, typer.Option(help="icl | vote | sparse-vote | answer-vote")] = "icl",
    retrieval_epsilon: Annotated[float, typer.Option(help="the threshold's epsilon")] = 0.0,
    composition: Annotated[str, typer.Option(help="icl: pure | bounded-range")] = "pure",
    voters: Annotated[int, typer.Option(help="vote / sparse-vote: most voters")] = 64,
    max_releases: Annotated[int, typer.Option(help="sparse-vote: most paid tokens")] = 6,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Per-token parameters of a DP-RAG answer of T tokens within a per-answer target.

    For vote and sparse-vote it also prints LimitedDomain's release threshold in votes: a
    plan whose threshold exceeds the voters can only abstain.
    """
    from retriever.rag.accounting import rag_privacy_plan
    from retriever.rag.plan import make_plan

    if mechanism == "icl":
        plan = rag_privacy_plan(
            tokens,
            delta,
            target_epsilon,
            retrieval_epsilon=retrieval_epsilon,
            composition=composition,
        )
        line = f"composition={composition}"
    else:
        share = retrieval_epsilon / target_epsilon if retrieval_epsilon > 0 else 0.1
        plan = make_plan(
            mechanism,
            target_epsilon,
            delta=delta,
            max_tokens=tokens,
            retrieval_share=share,
            max_releases=max_releases,
        ).vote_summary(voters)
        line = (
            f"voters={voters} limited_domain_threshold={plan['limited_domain_threshold']:.1f} "
            f"release_possible={plan['release_possible']}"
        )
    if as_json:
        print(json.dumps(plan))
    else:
        print(
            f"token_epsilon={plan['token_epsilon']:.6g} epsilon={plan['epsilon']:.6g} "
            f"delta={plan['delta']:g} tokens={plan['tokens']} mechanism={mechanism} {line}"
        )


def answer(
    index: IndexOption,
    private_corpus: PrivateCorpusOption,
    question: Annotated[str, typer.Option(help="the question")],
    epsilon: Annotated[float, typer.Option(help="per-answer epsilon")],
    dataset: Annotated[
        str, typer.Option(help="the collection's name in the ledger (its caps hold for it)")
    ],
    mechanism: Annotated[
        str, typer.Option(help="auto (best evaluated) | icl | vote | sparse-vote | answer-vote")
    ] = "auto",
    ledger: LedgerOption = None,
    tenant: Annotated[str, typer.Option(help="who pays")] = "default",
    tenant_epsilon: Annotated[
        float,
        typer.Option(
            help="cap of a new tenant scope (existing scopes keep theirs)", callback=positive
        ),
    ] = 10.0,
    tenant_delta: Annotated[
        float, typer.Option(help="delta cap of a new tenant scope", callback=probability)
    ] = 1e-5,
    collection_epsilon: Annotated[
        float | None,
        typer.Option(
            help="cap over all tenants, if the collection has none (required then)",
            callback=positive,
        ),
    ] = None,
    collection_delta: CollectionDeltaOption = None,
    k: Annotated[
        int | None, typer.Option(help="documents the DP threshold aims at (default: evaluated)")
    ] = None,
    max_tokens: MaxTokensOption = 12,
    delta: Annotated[float, typer.Option(help="per-answer delta (below 1/n)")] = 1e-6,
    composition: CompositionOption = "pure",
    score: Annotated[bool, typer.Option(help="also release a noisy count and score")] = False,
    min_score: MinScoreOption = 0.0,
    max_score: MaxScoreOption = 1.0,
    lm: Annotated[str, typer.Option(help="LM asset or path")] = "smollm2-135m-instruct",
    encoder_independent_of_collection: EncoderIndependentOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Answer a question from a private collection with DP, charged to a tenant's budget.

    The collection needs a collection cap over all tenants (--collection-epsilon and
    --collection-delta open it), or each new --tenant would be a fresh budget. Every answer
    charged to a collection is the same event: the first answer (or server) pins its
    --epsilon, --mechanism, --delta and --max-tokens, and other settings are refused.
    Refused before anything is charged: a δ (--delta or a scope's cap) of 1/n or more for
    n documents, and an encoder not known to be independent of the collection.
    """
    from retriever.index_folder import index_encoder, read_index_meta
    from retriever.rag import RagConfig, ScoreRange
    from retriever.rag.answer import plan_answer
    from retriever.rag.collection import (
        check_answer_event,
        check_delta,
        check_encoder,
        open_answer_scopes,
        pin_answer_event,
    )
    from retriever.rag.defaults import resolve
    from retriever.rag.loading import load_dprag
    from synthgen.paths import default_ledger_path
    from synthgen.privacy import COLLECTION, PrivacyLedger, Scope

    mechanism, k = resolve(mechanism, k, epsilon)

    config = RagConfig(
        k=k,
        max_tokens=max_tokens,
        delta=delta,
        composition=composition,
        score_share=0.05 if score else 0.0,
        score_range=ScoreRange(min_score, max_score),
    )
    plan = plan_answer(config, mechanism, epsilon)
    if (collection_epsilon is None) != (collection_delta is None):
        raise ValueError("pass both --collection-epsilon and --collection-delta, or neither")
    collection = None
    if collection_epsilon is not None:
        collection = Scope(COLLECTION, dataset, collection_epsilon, collection_delta)
    # refuse before writing or loading anything
    meta = read_index_meta(index)
    documents = len(meta["doc_ids"])
    check_delta(delta, documents, "--delta (per answer)")
    encoder, _ = index_encoder(index, meta=meta, option=None)
    check_encoder(encoder, asserted=encoder_independent_of_collection)
    book = PrivacyLedger(ledger or default_ledger_path())
    check_answer_event(book, dataset, plan)
    open_answer_scopes(
        book,
        Scope(tenant, dataset, tenant_epsilon, tenant_delta),
        documents=documents,
        collection=collection,
    )
    book.check(
        tenant,
        dataset,
        stage="rag-answer",
        event=plan.worst_case_event(),
        relation="ADD_OR_REMOVE_ONE",
        delta=delta,
    )
    rag = load_dprag(
        index,
        private_corpus,
        lm=lm,
        ledger=book,
        dataset=dataset,
        config=config,
        encoder_independent_of_collection=encoder_independent_of_collection,
    )
    pin_answer_event(book, dataset, plan)
    result = rag.answer(question, tenant=tenant, epsilon=epsilon, mechanism=mechanism)
    if as_json:
        print(json.dumps(result.to_json()))
        return
    print(result.text)
    parts = ", ".join(f"{c.stage} {c.epsilon:.3g}" for c in result.charges)
    abstained = " abstained;" if result.abstained else ""
    print(
        f"[{mechanism}]{abstained} epsilon={result.epsilon:.4g} delta={result.delta:g} ({parts}); "
        f"remaining epsilon={result.remaining_epsilon:.4g} for tenant {tenant}"
    )

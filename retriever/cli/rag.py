"""`retriever answer` and `retriever privacy rag`: thin wrappers over `retriever.rag`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from retriever.cli_options import (
    MECHANISMS,
    AccountingOption,
    CollectionDeltaOption,
    CompositionOption,
    DocumentDeltaOption,
    DocumentEpsilonOption,
    EncoderIndependentOption,
    GuaranteesAddUpOption,
    IndexOption,
    MaxScoreOption,
    MaxTokensOption,
    MinScoreOption,
    PrivateCorpusOption,
    RelevanceThresholdOption,
    RetrievalOption,
    announce_answers,
    check_accounting,
    check_collection_paths,
    mechanism_choice,
)
from synthgen.command_line import HelpGroup, LedgerOption, choice, positive, probability

privacy_app = typer.Typer(cls=HelpGroup, help="Privacy calculators.", no_args_is_help=True)


@privacy_app.command("rag")
def privacy_rag(
    tokens: Annotated[int, typer.Option(help="most answer tokens T")],
    delta: Annotated[float, typer.Option(help="per-answer delta")],
    target_epsilon: Annotated[float, typer.Option(help="per-answer epsilon")],
    mechanism: Annotated[str, mechanism_choice(*MECHANISMS, help="the answer mechanism")] = "icl",
    retrieval_epsilon: Annotated[float, typer.Option(help="the threshold's epsilon")] = 0.0,
    composition: Annotated[
        str,
        choice("pure", "bounded-range", help="icl tokens' composition"),
    ] = "pure",
    voters: Annotated[int, typer.Option(help="keywords / facts: most voters")] = 64,
    max_keywords: Annotated[
        int, typer.Option(help="keywords: K, most keywords per voter's answer")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Per-token parameters of a DP-RAG answer of T tokens within a per-answer target.

    For keywords and facts it also prints the votes a keyword or value needs to clear the
    DP partition selection: a plan whose threshold exceeds the voters can only abstain.
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
        ).vote_summary(voters, max_keywords=max_keywords)
        line = (
            f"voters={voters} keyword_threshold={plan['keyword_threshold']:.1f} "
            f"release_possible={plan['release_possible']}"
        )
    if as_json:
        print(json.dumps(plan))
    else:
        print(
            f"token_epsilon={plan['token_epsilon']:.6g} epsilon={plan['epsilon']:.6g} "
            f"delta={plan['delta']:g} tokens={plan['tokens']} mechanism={mechanism} {line}"
        )


def _load_lm(lm: str):
    """(lm, prompt format): ``"tiny"`` is the byte-level test model with a plain prompt;
    any other name is loaded by `load_dprag` (an asset or path, chat prompt)."""
    if lm != "tiny":
        return lm, None
    from retriever.rag.prompts import PromptFormat
    from synthgen.lm_backends import TinyLM

    return TinyLM(), PromptFormat(chat=False)


def _stored_scope(ledger: str, tenant: str, dataset: str):
    """The tenant's scope on `dataset` in the ledger, or None (a SQLite file that does not
    exist holds none and is not created here)."""
    from synthgen.privacy import PrivacyLedger
    from synthgen.privacy.ledger_store import sqlite_path

    path = sqlite_path(ledger)
    if path is not None and not path.is_file():
        return None
    scopes = PrivacyLedger(ledger).scopes()
    return next((s for s in scopes if s.tenant == tenant and s.dataset == dataset), None)


def answer(
    index: IndexOption,
    private_corpus: PrivateCorpusOption,
    question: Annotated[str, typer.Option(help="the question")],
    epsilon: Annotated[float, typer.Option(help="per-answer epsilon")],
    dataset: Annotated[
        str, typer.Option(help="the collection's name in the ledger (its caps hold for it)")
    ],
    mechanism: Annotated[
        str,
        mechanism_choice(
            "auto",
            *MECHANISMS,
            help="the answer mechanism (auto: facts; icl in individual accounting)",
        ),
    ] = "auto",
    ledger: LedgerOption = None,
    tenant: Annotated[str, typer.Option(help="who pays")] = "default",
    tenant_epsilon: Annotated[
        float | None,
        typer.Option(
            help="open a new tenant scope with this cap (a tenant unknown to the ledger is "
            "refused without it; existing scopes keep theirs); individual accounting: the "
            "tenant's quota",
            callback=positive,
        ),
    ] = None,
    tenant_delta: Annotated[
        float, typer.Option(help="delta cap of a new tenant scope", callback=probability)
    ] = 1e-5,
    collection_epsilon: Annotated[
        float | None,
        typer.Option(
            help="cap over all tenants, if the collection has none (required then; not in "
            "individual accounting)",
            callback=positive,
        ),
    ] = None,
    collection_delta: CollectionDeltaOption = None,
    accounting: AccountingOption = "collection",
    document_epsilon: DocumentEpsilonOption = None,
    document_delta: DocumentDeltaOption = None,
    relevance_threshold: RelevanceThresholdOption = None,
    k: Annotated[
        int | None, typer.Option(help="documents the DP threshold aims at (default: evaluated)")
    ] = None,
    max_tokens: MaxTokensOption = 12,
    delta: Annotated[float, typer.Option(help="per-answer delta (below 1/n)")] = 1e-6,
    composition: CompositionOption = "pure",
    score: Annotated[bool, typer.Option(help="also release a noisy count and score")] = False,
    retrieval: RetrievalOption = "dense",
    min_score: MinScoreOption = 0.0,
    max_score: MaxScoreOption = 1.0,
    lm: Annotated[
        str, typer.Option(help="LM asset or path; 'tiny': byte-level test model")
    ] = "smollm2-135m-instruct",
    encoder_independent_of_collection: EncoderIndependentOption = False,
    guarantees_add_up: GuaranteesAddUpOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Answer a question from a private collection with DP, charged to a tenant's budget.

    Collection accounting (default): the collection needs a collection cap over all
    tenants (--collection-epsilon and --collection-delta open it), or each new --tenant
    would be a fresh budget. Every answer charged to a collection is the same event: the
    first answer (or server) pins its --epsilon, --mechanism, --delta and --max-tokens, and
    other settings are refused.

    Individual accounting (--accounting individual, icl only): each document of the
    collection has its own (--document-epsilon, --document-delta) filter over all answers
    of all tenants, and pays only for the answers it takes part in (score at least
    --relevance-threshold while its filter admits it); the tenant's scope is a quota and
    the collection takes no collection cap. The first answer fixes the filters (the
    per-document target and the charge of an answer at --epsilon); other settings are
    refused.

    Refused before anything is charged: a δ (--delta or a scope's cap) of 1/n or more for
    n documents, an encoder not known to be independent of the collection, and a new
    --dataset name over documents that other names have charged (without
    --guarantees-add-up: their guarantees would add up).
    """
    from retriever.rag.defaults import relevance_threshold as calibrated
    from retriever.rag.defaults import resolve

    if (collection_epsilon is None) != (collection_delta is None):
        raise ValueError("pass both --collection-epsilon and --collection-delta, or neither")
    mechanism, k = resolve(mechanism, k, epsilon, retrieval=retrieval, accounting=accounting)
    relevance_threshold = calibrated(relevance_threshold, retrieval)
    individual = (
        check_accounting(
            accounting,
            mechanism,
            document_epsilon,
            document_delta,
            collection_epsilon,
            collection_delta,
        )  # fmt: skip
        is not None
    )
    from retriever.index_folder import index_encoder, read_index_meta
    from retriever.rag import RagConfig, ScoreRange
    from retriever.rag.answer import plan_answer
    from retriever.rag.collection import PrivateCollection, check_encoder, pin_answer_event
    from retriever.rag.loading import load_dprag
    from synthgen.paths import default_ledger_path
    from synthgen.privacy import PrivacyLedger, Scope
    from synthgen.privacy.document_filters import DocumentFilters

    config = RagConfig(
        k=k,
        max_tokens=max_tokens,
        delta=delta,
        composition=composition,
        score_share=0.05 if score else 0.0,
        score_range=ScoreRange(min_score, max_score),
        accounting=accounting,
        relevance_threshold=relevance_threshold,
    )
    plan = plan_answer(config, mechanism, epsilon)
    # refuse before writing or loading anything
    check_collection_paths(index, private_corpus)
    stored = _stored_scope(ledger or default_ledger_path(), tenant, dataset)
    if stored is None and tenant_epsilon is None:
        raise typer.BadParameter(
            f"tenant {tenant} has no budget on {dataset}: register it with `retriever tenant "
            f"add {tenant} --dataset {dataset} ...`, or open one here with --tenant-epsilon E",
            param_hint="'--tenant'",
        )
    tenant_scope = stored or Scope(tenant, dataset, tenant_epsilon, tenant_delta)
    meta = read_index_meta(index)
    assertion = None  # overlap: scores from the corpus's words, no encoder to check
    if retrieval == "dense":
        encoder, _ = index_encoder(index, meta=meta, option=None)
        assertion = check_encoder(encoder, asserted=encoder_independent_of_collection)
    collection = PrivateCollection.read(
        private_corpus, dataset, cap_epsilon=collection_epsilon, cap_delta=collection_delta
    )
    book = PrivacyLedger(ledger or default_ledger_path())
    collection.admit(
        book,
        tenant_scope,
        plan,
        document_target=(document_epsilon, document_delta) if individual else None,
        encoder_assertion=assertion,
        guarantees_add_up=guarantees_add_up,
    )
    announce_answers(
        book,
        dataset,
        epsilon=plan.epsilon,
        delta=plan.delta,
        documents=collection.documents,
        document_target=(document_epsilon, document_delta) if individual else None,
    )
    model, prompt = _load_lm(lm)
    rag = load_dprag(
        index,
        private_corpus,
        lm=model,
        ledger=book,
        dataset=dataset,
        config=config,
        prompt=prompt,
        encoder_independent_of_collection=encoder_independent_of_collection,
        document_target=(document_epsilon, document_delta) if individual else None,
        answer_epsilon=epsilon if individual else None,
        retrieval=retrieval,
        collection=collection,
    )
    if not individual:
        pin_answer_event(book, dataset, plan)
    result = rag.answer(question, tenant=tenant, epsilon=epsilon, mechanism=mechanism)
    guarantee = None
    if individual:
        budget = DocumentFilters(book.store).get(dataset).budget
        guarantee = {
            "epsilon": budget.epsilon,
            "delta": budget.delta,
            "relevance_threshold": relevance_threshold,
        }
    if as_json:
        out = result.to_json()
        if individual:
            out.update(accounting="individual", document_guarantee=guarantee)
        print(json.dumps(out))
        return
    print(result.text)
    shown = result.to_json()  # one rounding: the JSON's, the service's and the log's
    parts = ", ".join(f"{c['stage']} {c['epsilon_text']}" for c in shown["charges"])
    abstained = " abstained;" if result.abstained else ""
    remaining = "remaining quota epsilon" if individual else "remaining epsilon"
    print(
        f"[{mechanism}]{abstained} epsilon={shown['epsilon_text']} delta={result.delta:g} "
        f"({parts}); {remaining}={shown['remaining_epsilon_text']} for tenant {tenant}"
    )
    if individual:
        print(
            f"per document: each record of {dataset} is (epsilon={guarantee['epsilon']:g}, "
            f"delta={guarantee['delta']:g})-DP over all answers of all tenants; a record pays "
            f"only for the answers it takes part in (relevance >= {relevance_threshold:g})"
        )
        # the filters' summary is not DP (exhaustion tells how many documents a question
        # touched): the operator reads it with `synthgen ledger documents`, not the output

"""`retriever answer` and `retriever privacy rag`: thin wrappers over `retriever.rag`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dpsynth.cli.retriever.options import (
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
    PerAnswerDeltaOption,
    PrivateCorpusOption,
    QuestionOption,
    RelevanceThresholdOption,
    RetrievalOption,
    ServedLmOption,
    announce_answers,
    check_collection_paths,
    mechanism_choice,
    rag_config,
    resolve_answer,
)
from dpsynth.cli.shared import group_app
from synthgen.command_line import JsonOption, LedgerOption, positive, probability

AnswerEpsilonOption = Annotated[float, typer.Option(help="per-answer epsilon")]
DatasetOption = Annotated[
    str, typer.Option(help="the collection's name in the ledger (its caps hold for it)")
]
AnswerMechanismOption = Annotated[
    str,
    mechanism_choice(
        "auto",
        *MECHANISMS,
        help="the answer mechanism (auto: facts; icl in individual accounting)",
    ),
]
TenantOption = Annotated[str, typer.Option(help="who pays")]
TenantEpsilonOption = Annotated[
    float | None,
    typer.Option(
        help="open a new tenant scope with this cap (a tenant unknown to the ledger is "
        "refused without it; existing scopes keep theirs); individual accounting: the "
        "tenant's quota",
        callback=positive,
    ),
]
TenantDeltaOption = Annotated[
    float, typer.Option(help="delta cap of a new tenant scope", callback=probability)
]
AnswerCollectionEpsilonOption = Annotated[
    float | None,
    typer.Option(
        help="cap over all tenants, if the collection has none (required then; not in "
        "individual accounting)",
        callback=positive,
    ),
]
KOption = Annotated[
    int | None, typer.Option(help="documents the DP threshold aims at (default: evaluated)")
]
AnswerDeltaOption = Annotated[float, typer.Option(help="per-answer delta (below 1/n)")]
ScoreOption = Annotated[bool, typer.Option(help="also release a noisy count and score")]

privacy_app = group_app("Privacy calculators.")


@privacy_app.command("rag")
def privacy_rag(
    tokens: Annotated[int, typer.Option(help="most answer tokens T")],
    delta: PerAnswerDeltaOption,
    target_epsilon: AnswerEpsilonOption,
    mechanism: Annotated[str, mechanism_choice(*MECHANISMS, help="the answer mechanism")] = "icl",
    retrieval_epsilon: Annotated[float, typer.Option(help="the threshold's epsilon")] = 0.0,
    composition: CompositionOption = "pure",
    voters: Annotated[int, typer.Option(help="keywords / facts: most voters")] = 64,
    max_keywords: Annotated[
        int, typer.Option(help="keywords: K, most keywords per voter's answer")
    ] = 1,
    as_json: JsonOption = False,
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


def _tenant_scope(ledger: str, tenant: str, dataset: str, epsilon: float | None, delta: float):
    """The tenant's stored scope on `dataset`, or a new one with caps (`epsilon`, `delta`)
    from --tenant-epsilon and --tenant-delta; a usage error when it has none and no
    --tenant-epsilon is given."""
    from synthgen.privacy import Scope

    stored = _stored_scope(ledger, tenant, dataset)
    if stored is None and epsilon is None:
        raise typer.BadParameter(
            f"tenant {tenant} has no budget on {dataset}: register it with `retriever tenant "
            f"add {tenant} --dataset {dataset} ...`, or open one here with --tenant-epsilon E",
            param_hint="'--tenant'",
        )
    return stored or Scope(tenant, dataset, epsilon, delta)


ANSWER_HELP = """Answer a question from a private collection with DP, charged to a tenant's budget.

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
--guarantees-add-up: their guarantees would add up)."""


def answer(
    index: IndexOption,
    private_corpus: PrivateCorpusOption,
    question: QuestionOption,
    epsilon: AnswerEpsilonOption,
    dataset: DatasetOption,
    mechanism: AnswerMechanismOption = "auto",
    ledger: LedgerOption = None,
    tenant: TenantOption = "default",
    tenant_epsilon: TenantEpsilonOption = None,
    tenant_delta: TenantDeltaOption = 1e-5,
    collection_epsilon: AnswerCollectionEpsilonOption = None,
    collection_delta: CollectionDeltaOption = None,
    accounting: AccountingOption = "collection",
    document_epsilon: DocumentEpsilonOption = None,
    document_delta: DocumentDeltaOption = None,
    relevance_threshold: RelevanceThresholdOption = None,
    k: KOption = None,
    max_tokens: MaxTokensOption = 12,
    delta: AnswerDeltaOption = 1e-6,
    composition: CompositionOption = "pure",
    score: ScoreOption = False,
    retrieval: RetrievalOption = "dense",
    min_score: MinScoreOption = 0.0,
    max_score: MaxScoreOption = 1.0,
    lm: ServedLmOption = "smollm2-135m-instruct",
    encoder_independent_of_collection: EncoderIndependentOption = False,
    guarantees_add_up: GuaranteesAddUpOption = False,
    as_json: JsonOption = False,
) -> None:
    from retriever.rag.answer import plan_answer
    from synthgen.paths import default_ledger_path

    if (collection_epsilon is None) != (collection_delta is None):
        raise ValueError("pass both --collection-epsilon and --collection-delta, or neither")
    mechanism, k, relevance_threshold, document_target = resolve_answer(
        mechanism, k, epsilon, retrieval, accounting, relevance_threshold,
        document_epsilon, document_delta, collection_epsilon, collection_delta,
    )  # fmt: skip
    config = rag_config(
        k, max_tokens, delta, min_score, max_score, composition=composition,
        score_share=0.05 if score else 0.0, accounting=accounting,
        relevance_threshold=relevance_threshold,
    )  # fmt: skip
    plan = plan_answer(config, mechanism, epsilon)
    # refuse before writing or loading anything
    check_collection_paths(index, private_corpus)
    ledger = ledger or default_ledger_path()
    scope = _tenant_scope(ledger, tenant, dataset, tenant_epsilon, tenant_delta)
    book, collection = _admit(
        ledger, scope, plan, index, private_corpus, (collection_epsilon, collection_delta),
        document_target, retrieval, encoder_independent_of_collection, guarantees_add_up,
    )  # fmt: skip
    rag = _load_rag(
        index, private_corpus, collection, book, lm, config, plan, epsilon, document_target,
        retrieval, encoder_independent_of_collection,
    )  # fmt: skip
    result = rag.answer(question, tenant=tenant, epsilon=epsilon, mechanism=mechanism)
    _print_answer(result, book, dataset, tenant, mechanism, config, document_target, as_json)


answer.__doc__ = ANSWER_HELP  # registered in `dpsynth.cli.retriever`, whose typer reads it as help


def _admit(
    ledger: str,
    tenant_scope,
    plan,
    index,
    private_corpus,
    caps: tuple[float | None, float | None],
    document_target: tuple[float, float] | None,
    retrieval: str,
    asserted: bool,
    guarantees_add_up: bool,
):
    """(ledger, collection): the corpus read as a `PrivateCollection` (opening the
    collection cap `caps` if it has none) and admitted for `tenant_scope` (every check and
    refusal of `PrivateCollection.admit`, before anything is charged), then the ledger
    and the weak guarantees announced."""
    from retriever.index_folder import read_index_meta
    from retriever.rag.collection import PrivateCollection
    from retriever.rag.loading import checked_encoder
    from synthgen.privacy import PrivacyLedger

    meta = read_index_meta(index)
    _, assertion = checked_encoder(index, meta, retrieval, asserted)
    dataset = tenant_scope.dataset
    collection = PrivateCollection.read(
        private_corpus, dataset, cap_epsilon=caps[0], cap_delta=caps[1]
    )
    book = PrivacyLedger(ledger)
    collection.admit(
        book,
        tenant_scope,
        plan,
        document_target=document_target,
        encoder_assertion=assertion,
        guarantees_add_up=guarantees_add_up,
    )
    announce_answers(
        book,
        dataset,
        epsilon=plan.epsilon,
        delta=plan.delta,
        documents=collection.documents,
        document_target=document_target,
    )
    return book, collection


def _load_rag(
    index,
    private_corpus,
    collection,
    book,
    lm: str,
    config,
    plan,
    epsilon: float,
    document_target: tuple[float, float] | None,
    retrieval: str,
    encoder_independent_of_collection: bool,
):
    """The admitted collection's `DPRag` (`load_dprag`); in collection accounting, the
    answer event pinned on the collection cap once it has loaded."""
    from retriever.network.local import TINY_LM, load_answer_lm
    from retriever.rag.collection import pin_answer_event
    from retriever.rag.loading import load_dprag

    individual = document_target is not None
    model, prompt = load_answer_lm(lm) if lm == TINY_LM else (lm, None)  # FlaxLM: loaded later
    rag = load_dprag(
        index,
        private_corpus,
        lm=model,
        ledger=book,
        dataset=collection.name,
        config=config,
        prompt=prompt,
        encoder_independent_of_collection=encoder_independent_of_collection,
        document_target=document_target,
        answer_epsilon=epsilon if individual else None,
        retrieval=retrieval,
        collection=collection,
    )
    if not individual:
        pin_answer_event(book, collection.name, plan)
    return rag


def _print_answer(result, book, dataset, tenant, mechanism, config, document_target, as_json):
    """The answer as one JSON object, or its text and a line of its charges (and in
    individual accounting, the per-document guarantee)."""
    from synthgen.privacy.document_filters import DocumentFilters

    individual = document_target is not None
    guarantee = None
    if individual:
        budget = DocumentFilters(book.store).get(dataset).budget
        guarantee = {
            "epsilon": budget.epsilon,
            "delta": budget.delta,
            "relevance_threshold": config.relevance_threshold,
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
            f"only for the answers it takes part in (relevance >= {config.relevance_threshold:g})"
        )
        # the filters' summary is not DP (exhaustion tells how many documents a question
        # touched): the operator reads it with `synthgen ledger documents`, not the output

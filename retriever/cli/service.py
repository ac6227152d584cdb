"""`retriever serve` and `retriever tenant add|list|revoke`: thin wrappers over
`retriever.service`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from retriever.cli_options import (
    MECHANISMS,
    AccountingOption,
    AnswerTimeoutOption,
    CollectionDeltaOption,
    CollectionEpsilonOption,
    CompositionOption,
    DocumentDeltaOption,
    DocumentEpsilonOption,
    EncoderIndependentOption,
    GuaranteesAddUpOption,
    HostOption,
    MaxQuestionTokensOption,
    MaxScoreOption,
    MaxTokensOption,
    MinScoreOption,
    PortOption,
    QueueOption,
    QueueTimeoutOption,
    RelevanceThresholdOption,
    ReplicasOption,
    RetrievalOption,
    ServedLmOption,
    announce_answers,
    check_accounting,
    check_accounting_mode,
    check_collection_paths,
    check_existing_ledger,
    check_reuse,
    mechanism_choice,
)
from synthgen.command_line import HelpGroup, choice, positive, probability

tenant_app = typer.Typer(cls=HelpGroup, help="Tenants of the DP-RAG service.", no_args_is_help=True)

LedgerOption = Annotated[str, typer.Option(help="ledger file or PostgreSQL URL")]
KnowledgeOption = Annotated[
    Path | None,
    typer.Option(help="serve a knowledge release instead (answers cost nothing; no ledger)"),
]


def serve(
    index: Annotated[Path | None, typer.Option(help="exact index of the private corpus")] = None,
    private_corpus: Annotated[
        Path | None, typer.Option(help="the private corpus.jsonl (doc_id, text)")
    ] = None,
    ledger: Annotated[str | None, typer.Option(help="ledger file or PostgreSQL URL")] = None,
    knowledge: KnowledgeOption = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 0,
    dataset: Annotated[
        str | None, typer.Option(help="collection name in the ledger (default: corpus stem)")
    ] = None,
    lm: ServedLmOption = "smollm2-135m-instruct",
    answer_epsilon: Annotated[
        float, typer.Option(help="every answer's epsilon", callback=positive)
    ] = 1.0,
    mechanism: Annotated[
        str,
        mechanism_choice(
            "auto",
            *MECHANISMS,
            help="every answer's mechanism (auto: facts; icl in individual accounting)",
        ),
    ] = "auto",
    replicas: ReplicasOption = 1,
    queue: QueueOption = 16,
    queue_timeout: QueueTimeoutOption = 30.0,
    max_question_tokens: MaxQuestionTokensOption = 128,
    answer_timeout: AnswerTimeoutOption = 120.0,
    public_index: Annotated[
        Path | None, typer.Option(help="index over a public/synthetic corpus (/retrieve)")
    ] = None,
    public_corpus: Annotated[Path | None, typer.Option(help="that corpus.jsonl")] = None,
    k: Annotated[
        int | None,
        typer.Option(help="documents the DP threshold aims to select (default: evaluation's)"),
    ] = None,
    max_tokens: MaxTokensOption = 12,
    delta: Annotated[float, typer.Option(help="per-answer delta", callback=probability)] = 1e-6,
    composition: CompositionOption = "pure",
    retrieval: RetrievalOption = "dense",
    min_score: MinScoreOption = 0.0,
    max_score: MaxScoreOption = 1.0,
    encoder_independent_of_collection: EncoderIndependentOption = False,
    guarantees_add_up: GuaranteesAddUpOption = False,
    accounting: AccountingOption = "collection",
    document_epsilon: DocumentEpsilonOption = None,
    document_delta: DocumentDeltaOption = None,
    relevance_threshold: RelevanceThresholdOption = None,
    share_document_summary: Annotated[
        bool,
        typer.Option(
            help="individual: show tenants the documents' summary on /budget (not DP: "
            "exhaustion tells how many documents a question touched)"
        ),
    ] = False,
    reuse_answers: Annotated[
        str,
        choice(
            "off",
            "tenant",
            "shared",
            help="a repeated question gets the answer released before, charged nothing "
            "(tenant: its own; shared: any tenant's, individual accounting only)",
        ),
    ] = "off",
    document_cache: Annotated[
        bool,
        typer.Option(
            help="compute every document's keys once at start (about 3 MB per 64-token "
            "document for SmolLM2-135M): an answer runs only the question"
        ),
    ] = False,
) -> None:
    """Serve DP answers over HTTP, charged to tenants' budgets (Ctrl-C stops).

    Collection accounting (the default): every answer is the same DP event
    (--answer-epsilon, --mechanism, --delta, --max-tokens): the first server or `retriever
    answer` of a collection pins it in the ledger and any other is refused, so the
    ledger's composition stays valid however tenants time their questions; the collection
    cap bounds all tenants together. Refused before loading: a collection without a
    collection cap, a δ (per answer or any cap of the collection) of 1/n or more for n
    documents, an encoder not known to be independent of the collection, and a public
    corpus or index that is the private one.

    With --knowledge DIR (a `retriever knowledge release` folder) it serves that release
    instead: /answer is ordinary RAG over it and charges nothing (no ledger, no key).

    Individual accounting (--accounting individual, icl only): the privacy statement is
    per document, over all tenants' answers together: each document is
    (--document-epsilon, --document-delta)-DP, charged only for the answers where it
    scores at least --relevance-threshold while its filter admits them, then left out.
    Tenant caps are quotas on how much each tenant may ask, not the guarantee. Refused
    before loading: another mechanism, a missing per-document target, and a collection
    with a collection cap.
    """
    from retriever.rag import RagConfig, ScoreRange
    from retriever.rag.defaults import relevance_threshold as calibrated
    from retriever.rag.defaults import resolve
    from retriever.service.app import ServiceConfig
    from retriever.service.server import load_service, serve

    if knowledge is not None:
        from retriever.knowledge_base import KnowledgeBase
        from retriever.service.knowledge_app import serve_knowledge

        serve_knowledge(KnowledgeBase.open(knowledge, lm=lm), host=host, port=port)
        return
    if index is None or private_corpus is None or ledger is None:
        raise typer.BadParameter(
            "give --index, --private-corpus and --ledger (or --knowledge DIR)",
            param_hint="'--index'",
        )
    mechanism, k = resolve(mechanism, k, answer_epsilon, retrieval=retrieval, accounting=accounting)
    relevance_threshold = calibrated(relevance_threshold, retrieval)
    document_target = check_accounting(accounting, mechanism, document_epsilon, document_delta)
    check_reuse(reuse_answers, accounting)
    if document_cache and lm == "tiny":
        raise typer.BadParameter("the tiny test LM has no keys to cache", param_hint="'--lm'")
    check_collection_paths(index, private_corpus)
    check_existing_ledger(ledger)

    service = load_service(
        index,
        private_corpus,
        ledger=ledger,
        lm=lm,
        replicas=replicas,
        dataset=dataset,
        rag_config=RagConfig(
            k=k,
            max_tokens=max_tokens,
            delta=delta,
            composition=composition,
            score_range=ScoreRange(min_score, max_score),
            accounting=accounting,
            relevance_threshold=relevance_threshold,
        ),
        config=ServiceConfig(
            answer_epsilon=answer_epsilon,
            mechanism=mechanism,
            queue_capacity=queue,
            queue_timeout=queue_timeout,
            max_question_tokens=max_question_tokens,
            answer_timeout=answer_timeout,
            share_document_summary=share_document_summary,
        ),
        public_index=public_index,
        public_corpus=public_corpus,
        encoder_independent_of_collection=encoder_independent_of_collection,
        guarantees_add_up=guarantees_add_up,
        document_target=document_target,
        reuse_answers=None if reuse_answers == "off" else reuse_answers,
        document_cache=document_cache,
        retrieval=retrieval,
    )
    announce_answers(
        service.ledger,
        service.dataset,
        epsilon=answer_epsilon,
        delta=delta,
        documents=len(service.replicas[0].doc_ids),
        document_target=document_target,
    )
    serve(service, host=host, port=port)


@tenant_app.command("add")
def tenant_add(
    name: Annotated[str, typer.Argument(help="tenant name")],
    epsilon: Annotated[float, typer.Option(help="the tenant's epsilon cap", callback=positive)],
    delta: Annotated[float, typer.Option(help="the tenant's delta cap", callback=probability)],
    ledger: LedgerOption,
    dataset: Annotated[str, typer.Option(help="collection name in the ledger (serve's --dataset)")],
    collection_epsilon: CollectionEpsilonOption = None,
    collection_delta: CollectionDeltaOption = None,
    accounting: AccountingOption = "collection",
    accountant: Annotated[
        str | None,
        typer.Option(
            help="the tenant's scope: pld | rdp | basic (default: pld; rdp for a quota in "
            "individual accounting, which cannot compose bounded-range icl: pld or basic "
            "there)"
        ),
    ] = None,
) -> None:
    """Register a tenant with its budget and print its API key (shown once, stored hashed).

    Collection accounting: the tenant's delta cap may not exceed the collection's (which
    `retriever serve` checks against 1/n for the collection's n documents). Individual
    accounting (--accounting individual, or a collection whose per-document filters are
    already in the ledger): the collection takes no collection cap and the tenant's caps
    are a quota; `retriever serve --accounting individual` opens the filters. Caps are
    checked before the ledger is opened; a ledger file this command created is removed
    again if it refuses the tenant.
    """
    from retriever.service.tenants import TenantRegistry
    from synthgen.privacy.ledger_store import removed_if_refused

    check_accounting_mode(accounting)
    with removed_if_refused(ledger):
        key = TenantRegistry.open(ledger).add(
            name,
            dataset,
            epsilon=epsilon,
            delta=delta,
            collection_epsilon=collection_epsilon,
            collection_delta=collection_delta,
            individual=accounting == "individual",
            accountant=accountant,
        )
    print(key)


@tenant_app.command("list")
def tenant_list(
    ledger: LedgerOption,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
) -> None:
    """Tenants, their budgets per collection, and the collections' caps.

    Collection names over the same documents are listed together at the end, with the
    composition of all their charges (what those documents have lost).

    A collection in individual accounting shows its per-document filters instead of a
    collection cap: each document's target and the summary over all documents (counts,
    largest / median / mean epsilon spent); its tenants' caps are quotas.
    """
    from retriever.service.tenants import TenantRegistry
    from synthgen.privacy import COLLECTION, format_epsilon
    from synthgen.privacy.document_filters import DocumentFilters

    check_existing_ledger(ledger)
    registry = TenantRegistry.open(ledger)
    filters = DocumentFilters(registry.ledger.store)
    individual = filters.datasets()
    scopes = registry.ledger.scopes()
    rows = []

    def scope_row(scope, tenant: str, status: str, key: str) -> dict:
        spend = registry.ledger.spent(scope.tenant, scope.dataset)
        return {
            "tenant": tenant,
            "status": status,
            "key": key,
            "dataset": scope.dataset,
            "accounting": "individual" if scope.dataset in individual else "collection",
            "epsilon_cap": scope.epsilon_cap,
            "delta_cap": scope.delta_cap,
            "spent_epsilon": spend.epsilon,
            "spent_epsilon_text": format_epsilon(spend.epsilon),
            "charges": spend.num_charges,
        }

    for tenant in registry.tenants():
        status = "active" if tenant.active else "revoked"
        for scope in (s for s in scopes if s.tenant == tenant.name):
            rows.append(scope_row(scope, tenant.name, status, f"dpk_{tenant.key_id}_…"))
    # scopes opened from the command line (`retriever answer --tenant-epsilon`, a release,
    # a training run) hold no key but spend on the collection too: listed, so that the
    # tenants' rows add up to the collection's
    registered = {t.name for t in registry.tenants()} | {COLLECTION}
    for scope in (s for s in scopes if s.tenant not in registered):
        rows.append(scope_row(scope, scope.tenant, "no key", "(command line)"))
    for scope in (s for s in scopes if s.tenant == COLLECTION):  # never in individual mode
        rows.append(
            scope_row(scope, "(collection: all tenants)", "cap", "")
            | {
                "notes": registry.ledger.scope_notes(COLLECTION, scope.dataset),
                "answer_event": registry.ledger.event_shape(COLLECTION, scope.dataset),
            }
        )
    for dataset in individual:
        record, summary = filters.get(dataset), filters.summary(dataset)
        rows.append(
            {
                "tenant": "(each document: all tenants)",
                "status": "filters",
                "key": "",
                "dataset": dataset,
                "accounting": "individual",
                "epsilon_cap": record.budget.epsilon,  # each document's target
                "delta_cap": record.budget.delta,
                "spent_epsilon": summary["max_epsilon"],  # the largest over documents
                "spent_epsilon_text": format_epsilon(summary["max_epsilon"]),
                "charges": None,
                "answers_per_document": record.answers_per_document,
                "documents": summary,
            }
        )
    groups = registry.ledger.document_groups()
    if as_json:
        for row in rows:
            print(json.dumps(row))
        for g in groups:
            print(json.dumps(g.to_json()))
        return
    print(f"{'tenant':28} {'status':8} {'dataset':16} {'spent/cap eps':>16} {'charges':>8}  key")
    for r in rows:
        spent = f"{r['spent_epsilon_text']}/{r['epsilon_cap']:g}"
        if r["status"] == "filters":
            d = r["documents"]
            last = (
                f"{'-':>8}  largest over documents; {d['exhausted']}/{d['documents']} "
                f"exhausted, median eps {format_epsilon(d['median_epsilon'])}, "
                f"delta {d['delta']:g}"
            )
        else:
            quota = " (quota)" if r["accounting"] == "individual" else ""
            last = f"{r['charges']:>8}  {r['key']}{quota}"
        print(f"{r['tenant']:28} {r['status']:8} {r['dataset']:16} {spent:>16} {last}")
    for g in groups:
        print(g.to_json()["line"])


@tenant_app.command("revoke")
def tenant_revoke(
    name: Annotated[str, typer.Argument(help="tenant name")],
    ledger: LedgerOption,
) -> None:
    """Revoke a tenant's key for good (its budget and charges stay in the ledger)."""
    from retriever.service.tenants import TenantRegistry

    check_existing_ledger(ledger)
    tenant = TenantRegistry.open(ledger).revoke(name)
    print(f"revoked {tenant.name}")

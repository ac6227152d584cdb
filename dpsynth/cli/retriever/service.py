"""`retriever serve` and `retriever tenant add|list|revoke`: thin wrappers over
`dpsynth.service`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.retriever.options import (
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
    check_accounting_mode,
    check_collection_paths,
    check_existing_ledger,
    check_reuse,
    mechanism_choice,
    rag_config,
    resolve_answer,
    service_config,
)
from dpsynth.cli.shared import group_app
from synthgen.command_line import choice, positive, probability

tenant_app = group_app("Tenants of the DP-RAG service.")

LedgerOption = Annotated[str, typer.Option(help="ledger file or PostgreSQL URL")]
TenantNameArgument = Annotated[str, typer.Argument(help="tenant name")]
KnowledgeOption = Annotated[
    Path | None,
    typer.Option(help="serve a knowledge release instead (answers cost nothing; no ledger)"),
]
ServeIndexOption = Annotated[Path | None, typer.Option(help="exact index of the private corpus")]
ServeCorpusOption = Annotated[
    Path | None, typer.Option(help="the private corpus.jsonl (doc_id, text)")
]
ServeLedgerOption = Annotated[str | None, typer.Option(help="ledger file or PostgreSQL URL")]
ServeDatasetOption = Annotated[
    str | None, typer.Option(help="collection name in the ledger (default: corpus stem)")
]
AnswerEpsilonOption = Annotated[
    float, typer.Option(help="every answer's epsilon", callback=positive)
]
ServeMechanismOption = Annotated[
    str,
    mechanism_choice(
        "auto",
        *MECHANISMS,
        help="every answer's mechanism (auto: facts; icl in individual accounting)",
    ),
]
PublicIndexOption = Annotated[
    Path | None, typer.Option(help="index over a public/synthetic corpus (/retrieve)")
]
PublicCorpusOption = Annotated[Path | None, typer.Option(help="that corpus.jsonl")]
ServeKOption = Annotated[
    int | None,
    typer.Option(help="documents the DP threshold aims to select (default: evaluation's)"),
]
ServeDeltaOption = Annotated[float, typer.Option(help="per-answer delta", callback=probability)]
ShareDocumentSummaryOption = Annotated[
    bool,
    typer.Option(
        help="individual: show tenants the documents' summary on /budget (not DP: "
        "exhaustion tells how many documents a question touched)"
    ),
]
ReuseAnswersOption = Annotated[
    str,
    choice(
        "off",
        "tenant",
        "shared",
        help="a repeated question gets the answer released before, charged nothing "
        "(tenant: its own; shared: any tenant's, individual accounting only)",
    ),
]
DocumentCacheOption = Annotated[
    bool,
    typer.Option(
        help="compute every document's keys once at start (about 3 MB per 64-token "
        "document for SmolLM2-135M): an answer runs only the question"
    ),
]


SERVE_HELP = """Serve DP answers over HTTP, charged to tenants' budgets (Ctrl-C stops).

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
with a collection cap."""


def serve(
    index: ServeIndexOption = None,
    private_corpus: ServeCorpusOption = None,
    ledger: ServeLedgerOption = None,
    knowledge: KnowledgeOption = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 0,
    dataset: ServeDatasetOption = None,
    lm: ServedLmOption = "smollm2-135m-instruct",
    answer_epsilon: AnswerEpsilonOption = 1.0,
    mechanism: ServeMechanismOption = "auto",
    replicas: ReplicasOption = 1,
    queue: QueueOption = 16,
    queue_timeout: QueueTimeoutOption = 30.0,
    max_question_tokens: MaxQuestionTokensOption = 128,
    answer_timeout: AnswerTimeoutOption = 120.0,
    public_index: PublicIndexOption = None,
    public_corpus: PublicCorpusOption = None,
    k: ServeKOption = None,
    max_tokens: MaxTokensOption = 12,
    delta: ServeDeltaOption = 1e-6,
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
    share_document_summary: ShareDocumentSummaryOption = False,
    reuse_answers: ReuseAnswersOption = "off",
    document_cache: DocumentCacheOption = False,
) -> None:
    from dpsynth.service.server import serve

    if knowledge is not None:
        _serve_knowledge(knowledge, lm, host, port)
        return
    mechanism, k, relevance_threshold, document_target = _refuse_before_loading(
        index, private_corpus, ledger, lm, mechanism, k, answer_epsilon, retrieval,
        accounting, relevance_threshold, document_epsilon, document_delta, reuse_answers,
        document_cache,
    )  # fmt: skip
    answers = rag_config(
        k, max_tokens, delta, min_score, max_score, composition=composition,
        accounting=accounting, relevance_threshold=relevance_threshold,
    )  # fmt: skip
    config = service_config(
        answer_epsilon, mechanism, queue, queue_timeout, max_question_tokens, answer_timeout,
        share_document_summary=share_document_summary,
    )  # fmt: skip
    service = _load_service(
        index, private_corpus, ledger, lm, replicas, dataset, answers, config, public_index,
        public_corpus, encoder_independent_of_collection, guarantees_add_up, document_target,
        reuse_answers, document_cache, retrieval,
    )  # fmt: skip
    serve(service, host=host, port=port)


serve.__doc__ = SERVE_HELP  # registered in `dpsynth.cli.retriever`, whose typer reads it as help


def _serve_knowledge(knowledge: Path, lm: str, host: str, port: int) -> None:
    """`serve --knowledge`: ordinary RAG over a knowledge release, nothing charged."""
    from dpsynth.service.knowledge_app import serve_knowledge
    from retriever.knowledge_base import KnowledgeBase

    serve_knowledge(KnowledgeBase.open(knowledge, lm=lm), host=host, port=port)


def _load_service(
    index: Path,
    private_corpus: Path,
    ledger: str,
    lm: str,
    replicas: int,
    dataset: str | None,
    rag_config,
    config,
    public_index: Path | None,
    public_corpus: Path | None,
    encoder_independent_of_collection: bool,
    guarantees_add_up: bool,
    document_target: tuple[float, float] | None,
    reuse_answers: str,
    document_cache: bool,
    retrieval: str,
):
    """The loaded service (`dpsynth.service.server.load_service`: its own refusals come
    before anything heavy is loaded), then its ledger and weak guarantees announced."""
    from dpsynth.service.server import load_service

    service = load_service(
        index,
        private_corpus,
        ledger=ledger,
        lm=lm,
        replicas=replicas,
        dataset=dataset,
        rag_config=rag_config,
        config=config,
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
        epsilon=config.answer_epsilon,
        delta=rag_config.delta,
        documents=len(service.replicas[0].doc_ids),
        document_target=document_target,
    )
    return service


def _refuse_before_loading(
    index: Path | None,
    private_corpus: Path | None,
    ledger: str | None,
    lm: str,
    mechanism: str,
    k: int | None,
    answer_epsilon: float,
    retrieval: str,
    accounting: str,
    relevance_threshold: float | None,
    document_epsilon: float | None,
    document_delta: float | None,
    reuse_answers: str,
    document_cache: bool,
) -> tuple[str, int, float, tuple[float, float] | None]:
    """`serve`'s checks of its options and paths, before any ledger is opened or model
    loaded: (mechanism, k, relevance threshold, per-document target) as `resolve_answer`
    gives them, or a usage error."""
    if index is None or private_corpus is None or ledger is None:
        raise typer.BadParameter(
            "give --index, --private-corpus and --ledger (or --knowledge DIR)",
            param_hint="'--index'",
        )
    settings = resolve_answer(
        mechanism,
        k,
        answer_epsilon,
        retrieval,
        accounting,
        relevance_threshold,
        document_epsilon,
        document_delta,
    )
    check_reuse(reuse_answers, accounting)
    if document_cache and lm == "tiny":
        raise typer.BadParameter("the tiny test LM has no keys to cache", param_hint="'--lm'")
    check_collection_paths(index, private_corpus)
    check_existing_ledger(ledger)
    return settings


@tenant_app.command("add")
def tenant_add(
    name: TenantNameArgument,
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
    from dpsynth.service.tenants import TenantRegistry
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
    from dpsynth.service.tenants import TenantRegistry

    check_existing_ledger(ledger)
    registry = TenantRegistry.open(ledger)
    rows = _tenant_rows(registry)
    groups = registry.ledger.document_groups()
    if as_json:
        for row in rows:
            print(json.dumps(row))
        for g in groups:
            print(json.dumps(g.to_json()))
        return
    _print_tenant_table(rows)
    for g in groups:
        print(g.to_json()["line"])


def _tenant_rows(registry) -> list[dict]:
    """`tenant list`'s rows: each tenant's scopes, the scopes opened from the command line,
    the collection caps, and the per-document filters of collections in individual
    accounting."""
    from synthgen.privacy import COLLECTION
    from synthgen.privacy.document_filters import DocumentFilters

    book = registry.ledger
    filters = DocumentFilters(book.store)
    individual = filters.datasets()
    scopes = book.scopes()
    rows = []
    for tenant in registry.tenants():
        status = "active" if tenant.active else "revoked"
        for scope in (s for s in scopes if s.tenant == tenant.name):
            key = f"dpk_{tenant.key_id}_…"
            rows.append(_scope_row(book, individual, scope, tenant.name, status, key))
    # scopes opened from the command line (`retriever answer --tenant-epsilon`, a release,
    # a training run) hold no key but spend on the collection too: listed, so that the
    # tenants' rows add up to the collection's
    registered = {t.name for t in registry.tenants()} | {COLLECTION}
    for scope in (s for s in scopes if s.tenant not in registered):
        rows.append(_scope_row(book, individual, scope, scope.tenant, "no key", "(command line)"))
    for scope in (s for s in scopes if s.tenant == COLLECTION):  # never in individual mode
        rows.append(
            _scope_row(book, individual, scope, "(collection: all tenants)", "cap", "")
            | {
                "notes": book.scope_notes(COLLECTION, scope.dataset),
                "answer_event": book.event_shape(COLLECTION, scope.dataset),
            }
        )
    for dataset in individual:
        rows.append(_filters_row(filters, dataset))
    return rows


def _scope_row(book, individual, scope, tenant: str, status: str, key: str) -> dict:
    """One scope's row: its caps and what it has spent (`individual`: the collections in
    individual accounting, whose tenants' caps are quotas)."""
    from synthgen.privacy import format_epsilon

    spend = book.spent(scope.tenant, scope.dataset)
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


def _filters_row(filters, dataset: str) -> dict:
    """The row of a collection's per-document filters: each document's target and the
    summary over all documents."""
    from synthgen.privacy import format_epsilon

    record, summary = filters.get(dataset), filters.summary(dataset)
    return {
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


def _print_tenant_table(rows: list[dict]) -> None:
    """`tenant list`'s table, one line per row."""
    from synthgen.privacy import format_epsilon

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


@tenant_app.command("revoke")
def tenant_revoke(
    name: TenantNameArgument,
    ledger: LedgerOption,
) -> None:
    """Revoke a tenant's key for good (its budget and charges stay in the ledger)."""
    from dpsynth.service.tenants import TenantRegistry

    check_existing_ledger(ledger)
    tenant = TenantRegistry.open(ledger).revoke(name)
    print(f"revoked {tenant.name}")

"""Typer option declarations that several `retriever` commands share.

`retriever answer`, `serve`, `tenant add` and `contributor serve|key add` take the same
options for the same things (the private index and corpus, the answer's RAG settings, the
collection cap, the server's queue): each is declared once here, with the checks and
configs those commands build from them alike; defaults stay in each command's signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import click
import typer

from synthgen.command_line import (  # noqa: F401 - GuaranteesAddUpOption: shared with synthgen
    GuaranteesAddUpOption,
    choice,
    one_of,
    positive,
    probability,
)

# `retriever.rag.plan.MECHANISMS`, spelled out so that the CLI imports no JAX or accounting
# code to print its help (a test checks they agree)
MECHANISMS = ("icl", "keywords", "facts")


def mechanism_choice(*values: str, help: str) -> Any:  # noqa: A002 - typer's own name
    """`choice(*values)` for ``--mechanism``: a retired mechanism (`retriever.rag.plan.RETIRED`)
    is a usage error that says it was retired and what to use instead."""
    check = one_of(*values)

    def checked(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and value not in values:
            from retriever.rag.plan import RETIRED, retired_message  # the error path only

            if value in RETIRED:
                raise click.UsageError(f"--mechanism: {retired_message(value)}", ctx)
        return check(ctx, param, value)

    return typer.Option(help=help, metavar="|".join(values), callback=checked)


# the private collection
IndexOption = Annotated[Path, typer.Option(help="exact index over the private corpus")]
PrivateCorpusOption = Annotated[Path, typer.Option(help="private corpus.jsonl: doc_id, text")]
EncoderIndependentOption = Annotated[
    bool,
    typer.Option(
        "--encoder-independent-of-collection",
        help="assert that the index's encoder was not trained on this collection where "
        "its provenance does not show it (recorded on the collection cap)",
    ),
]
CollectionEpsilonOption = Annotated[
    float | None,
    typer.Option(help="cap over all tenants, if the collection has none", callback=positive),
]
CollectionDeltaOption = Annotated[
    float | None, typer.Option(help="its delta cap", callback=probability)
]

# the answer (retriever.rag.RagConfig)
MaxTokensOption = Annotated[int, typer.Option(help="most answer tokens")]
CompositionOption = Annotated[
    str,
    choice("pure", "bounded-range", help="icl tokens' composition"),
]
RetrievalOption = Annotated[
    str,
    choice(
        "dense",
        "overlap",
        help="how documents are scored: the index's encoder (dense), or the share of the "
        "question's rare words a document holds (overlap: better for invented or rare "
        "names; the index then only lists the documents)",
    ),
]
MinScoreOption = Annotated[float, typer.Option(help="public lower clip of similarities")]
MaxScoreOption = Annotated[float, typer.Option(help="public upper clip of similarities")]
QuestionOption = Annotated[str, typer.Option(help="the question")]
PerAnswerDeltaOption = Annotated[float, typer.Option(help="per-answer delta")]

# the server (dpsynth.service.ServiceConfig)
ServedLmOption = Annotated[
    str, typer.Option(help="LM asset or path; 'tiny': byte-level test model")
]
HostOption = Annotated[str, typer.Option(help="interface to listen on")]
PortOption = Annotated[int, typer.Option(help="port (0: a free one, printed)", min=0, max=65535)]
ReplicasOption = Annotated[int, typer.Option(help="model replicas (one answer each)")]
QueueOption = Annotated[int, typer.Option(help="most requests waiting for a replica")]
QueueTimeoutOption = Annotated[float, typer.Option(help="seconds a request may wait")]
MaxQuestionTokensOption = Annotated[
    int, typer.Option(help="longest question in tokens of the answer LM (413 beyond)")
]
AnswerTimeoutOption = Annotated[
    float, typer.Option(help="seconds an answer may run; then it returns truncated")
]

# the fact release (`retriever knowledge release`, `contributor build`: retriever.network.knowledge)
FactCorpusOption = Annotated[Path, typer.Option(help="private corpus.jsonl (doc_id, text)")]
ReleaseOutOption = Annotated[Path, typer.Option(help="release folder (safe to ship)")]
MaxPairsOption = Annotated[
    int, typer.Option(help="K, facts one record contributes", callback=positive)
]
ReleaseDatasetOption = Annotated[str | None, typer.Option(help="collection name in the ledger")]

# individual (per-document) accounting (retriever.rag.RagConfig.accounting)
AccountingOption = Annotated[
    str,
    choice(
        "collection",
        "individual",
        help="collection: every answer composes on the collection cap; individual: each "
        "document pays only for the answers it takes part in (per-document filters; icl)",
    ),
]
DocumentEpsilonOption = Annotated[
    float | None,
    typer.Option(
        help="individual: each document's epsilon over all tenants' answers", callback=positive
    ),
]
DocumentDeltaOption = Annotated[
    float | None,
    typer.Option(help="individual: each document's delta (below 1/n)", callback=probability),
]
RelevanceThresholdOption = Annotated[
    float | None,
    typer.Option(
        help="individual: public relevance threshold on the [0, 1] score scale; documents "
        "below it are not used and pay nothing (default: calibrated on a public world, "
        "0.6 dense, 0.75 overlap)",
        callback=probability,
    ),
]


def check_accounting_mode(accounting: str) -> None:
    """A usage error (exit 2) for an unknown --accounting."""
    from retriever.rag.config import ACCOUNTING_MODES

    if accounting not in ACCOUNTING_MODES:
        raise click.UsageError(
            f"--accounting must be one of {', '.join(ACCOUNTING_MODES)}, got {accounting!r}"
        )


def check_accounting(
    accounting: str,
    mechanism: str,
    document_epsilon: float | None,
    document_delta: float | None,
    collection_epsilon: float | None = None,
    collection_delta: float | None = None,
) -> tuple[float, float] | None:
    """The per-document target (epsilon, delta) in individual accounting, None in
    collection accounting, or a usage error (exit 2) for options that do not go with the
    mode, from public options only, before anything is read or loaded."""
    check_accounting_mode(accounting)
    if accounting == "collection":
        if document_epsilon is not None or document_delta is not None:
            raise click.UsageError(
                "--document-epsilon and --document-delta go with --accounting individual"
            )
        return None
    if mechanism != "icl":
        raise click.UsageError(
            f"--accounting individual answers with icl only, got --mechanism {mechanism}: "
            "keywords' and facts' partition selections have no zCDP curve for a "
            "per-document filter"
        )
    if document_epsilon is None or document_delta is None:
        raise click.UsageError(
            "--accounting individual needs --document-epsilon and --document-delta (each "
            "document's target over all answers of all tenants)"
        )
    if collection_epsilon is not None or collection_delta is not None:
        raise click.UsageError(
            "--accounting individual takes no collection cap (per-document filters replace "
            "it): drop --collection-epsilon / --collection-delta"
        )
    return document_epsilon, document_delta


def resolve_answer(
    mechanism: str,
    k: int | None,
    epsilon: float,
    retrieval: str,
    accounting: str,
    relevance_threshold: float | None,
    document_epsilon: float | None,
    document_delta: float | None,
    collection_epsilon: float | None = None,
    collection_delta: float | None = None,
) -> tuple[str, int, float, tuple[float, float] | None]:
    """`retriever answer` and `serve`: (mechanism, k, relevance threshold, per-document
    target) from public options only, before anything is read or loaded: "auto" and a
    missing k resolved (`retriever.rag.defaults.resolve`), the threshold calibrated when
    not given, the options checked against the accounting (`check_accounting`)."""
    from retriever.rag.defaults import relevance_threshold as calibrated
    from retriever.rag.defaults import resolve

    mechanism, k = resolve(mechanism, k, epsilon, retrieval=retrieval, accounting=accounting)
    threshold = calibrated(relevance_threshold, retrieval)
    target = check_accounting(
        accounting,
        mechanism,
        document_epsilon,
        document_delta,
        collection_epsilon,
        collection_delta,
    )
    return mechanism, k, threshold, target


def rag_config(
    k: int, max_tokens: int, delta: float, min_score: float, max_score: float, **settings: Any
):
    """The answer's `retriever.rag.RagConfig` from the options `retriever answer`, `serve`
    and `contributor serve` share (the score clip from --min-score and --max-score), with
    any other of its fields in `settings`."""
    from retriever.rag import RagConfig, ScoreRange

    score_range = ScoreRange(min_score, max_score)
    return RagConfig(k=k, max_tokens=max_tokens, delta=delta, score_range=score_range, **settings)


def service_config(
    answer_epsilon: float,
    mechanism: str,
    queue: int,
    queue_timeout: float,
    max_question_tokens: int,
    answer_timeout: float,
    **settings: Any,
):
    """The server's `dpsynth.service.app.ServiceConfig` from the options `retriever serve`
    and `contributor serve` share, with any other of its fields in `settings`."""
    from dpsynth.service.app import ServiceConfig

    return ServiceConfig(
        answer_epsilon=answer_epsilon,
        mechanism=mechanism,
        queue_capacity=queue,
        queue_timeout=queue_timeout,
        max_question_tokens=max_question_tokens,
        answer_timeout=answer_timeout,
        **settings,
    )


def check_reuse(reuse_answers: str, accounting: str) -> None:
    """A usage error (exit 2) for an unknown --reuse-answers, or ``shared`` outside
    individual accounting (a shared answer would bypass a tenant's cap)."""
    if reuse_answers not in ("off", "tenant", "shared"):
        raise click.UsageError(
            f"--reuse-answers must be one of off, tenant, shared, got {reuse_answers!r}"
        )
    if reuse_answers == "shared" and accounting != "individual":
        raise click.UsageError(
            "--reuse-answers shared needs --accounting individual: under collection "
            "accounting a tenant's cap bounds what it learns (use tenant)"
        )


def check_collection_paths(index: Path | None, private_corpus: Path | None) -> None:
    """A missing index folder or corpus file is a usage error naming it (exit 2), checked
    before any ledger is opened or model loaded."""
    if index is not None and not (index / "index.json").is_file():
        raise typer.BadParameter(
            f"no index at {index} (build one with `retriever index build --corpus "
            "CORPUS.jsonl --out DIR`)",
            param_hint="'--index'",
        )
    if private_corpus is not None and not private_corpus.is_file():
        raise typer.BadParameter(
            f"no corpus file at {private_corpus}", param_hint="'--private-corpus'"
        )


def check_existing_ledger(ledger: str) -> None:
    """A SQLite ledger that does not exist is a usage error (exit 2): a mistyped path would
    otherwise start an empty ledger, with none of the tenants and caps of the real one.
    Ledgers are created by `retriever tenant add` (a PostgreSQL URL is not checked)."""
    from synthgen.privacy.ledger_store import sqlite_path

    path = sqlite_path(ledger)
    if path is not None and not path.is_file():
        raise typer.BadParameter(
            f"no ledger at {path}: create it with `retriever tenant add NAME --ledger {path} "
            "...` (a mistyped path would start an empty one)",
            param_hint="'--ledger'",
        )


def announce_answers(
    ledger,
    dataset: str,
    *,
    epsilon: float,
    delta: float,
    documents: int,
    document_target: tuple[float, float] | None = None,
) -> None:
    """`retriever answer` and `serve`, once admitted: the ledger that holds the answers'
    charges (`synthgen.privacy.notices`), and a warning for each weak guarantee stated:
    the per-answer one, and the collection's (its collection cap, or each document's
    target in individual accounting) over n = `documents`."""
    from synthgen.privacy.notices import announce_ledger, warn_weak_guarantee

    announce_ledger(ledger, dataset)
    warn_weak_guarantee(epsilon, delta, documents, what="per answer")
    if document_target is not None:
        warn_weak_guarantee(*document_target, documents, what="per document")
        return
    cap = ledger.collection_scope(dataset)
    if cap is not None:
        warn_weak_guarantee(cap.epsilon_cap, cap.delta_cap, documents, what="collection cap")

"""Loads a `Service` from files and runs it under uvicorn on a socket it binds itself."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

from dpsynth.service.app import (
    Service,
    ServiceConfig,
    create_app,
)
from dpsynth.service.public_index import PublicIndex
from dpsynth.service.tenants import TenantRegistry
from retriever.network.local import TINY_LM, load_answer_lm
from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.collection import refuse_collection_cap, require_collection_cap
from synthgen.privacy import PrivacyLedger
from synthgen.privacy.document_filters import DocumentFilters
from synthgen.privacy.receipts import collection_payer


def load_service(
    index: str | Path,
    private_corpus: str | Path,
    *,
    ledger: str,
    lm: str = "smollm2-135m-instruct",
    replicas: int = 1,
    dataset: str | None = None,
    rag_config: RagConfig | None = None,
    config: ServiceConfig | None = None,
    public_index: str | Path | None = None,
    public_corpus: str | Path | None = None,
    encoder_independent_of_collection: bool = False,
    document_target: tuple[float, float] | None = None,
    reuse_answers: str | None = None,
    document_cache: bool = False,
    retrieval: str = "dense",
    guarantees_add_up: bool = False,
) -> Service:
    """The service over `private_corpus` (indexed exactly in `index`) and `ledger`.

    Every refusal below comes before anything heavy loads, except `load_dprag`'s (an encoder
    not known to be independent of the collection, δ caps of 1/n or more). Collection
    accounting then pins its answer event on the collection cap; individual accounting
    opens (or checks) the per-document filters and pins nothing.

    Args:
      index: exact index over the private corpus (`retriever index build --kind exact`).
      private_corpus: corpus.jsonl (doc_id, text) of the private collection.
      ledger: ledger file or PostgreSQL URL (tenants and budgets).
      lm: LM asset or path, or ``"tiny"`` (the byte-level test model).
      replicas: model replicas (one answer at a time each; they share weights).
      dataset: the collection's name in the ledger (default: the corpus file's stem).
      rag_config: public parameters of the answer stage (default `RagConfig()`).
      config: the service's limits (default `ServiceConfig()`).
      public_index: index over a public/synthetic corpus for ``/retrieve`` (optional).
      public_corpus: that corpus.
      encoder_independent_of_collection: the operator asserts the index's encoder was not
        trained on the collection (recorded on the collection cap; see `load_dprag`).
      document_target: individual accounting: each document's (epsilon, delta) over every
        answer of every tenant (required there, refused otherwise).
      reuse_answers: "tenant" or "shared" (individual accounting only): a repeated
        question gets the answer released before, for free (`retriever.rag.reuse`; one
        store for all replicas, in memory); None: every question is answered.
      document_cache: every document's keys computed once at start, shared by the
        replicas (`DPRag`'s `document_cache`; an LM with `document_kv`, not "tiny").
      retrieval: "dense" or "overlap" (`load_dprag`).
      guarantees_add_up: bind `dataset` to the corpus's documents although other names of
        the ledger have charged them (`load_dprag`; refused otherwise).

    Raises:
      ValueError: bad arguments, the collection has no collection cap in the ledger
        (collection accounting) or has one (individual accounting), a mechanism other than
        icl or a missing or changed `document_target` (individual accounting), the public
        corpus or index is the private one, another answer event is pinned, or a check of
        `load_dprag` fails.

    Privacy:
      Every answer is `DPRag.answer` (one document, add/remove-one). Collection
      accounting: the same event for every answer of the collection, whichever server
      charges it, composed on the collection cap. Individual accounting: each document's
      own filter bounds its loss over all tenants' answers (Feldman & Zrnic 2021); tenant
      scopes are quotas. ``/retrieve`` reads the public index only, so that index must not
      be the private collection's.
    """
    from retriever.rag.answer import plan_answer
    from retriever.rag.collection import check_answer_event, pin_answer_event
    from retriever.rag.loading import load_dprag

    rag_config, config = rag_config or RagConfig(), config or ServiceConfig()

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas=}")
    if (public_index is None) != (public_corpus is None):
        raise ValueError("pass both --public-index and --public-corpus, or neither")
    if public_index is not None:
        refuse_private_as_public(index, private_corpus, public_index, public_corpus)
    individual = rag_config.individual
    if individual:
        check_individual(config, document_target)
    elif document_target is not None:
        raise ValueError("a per-document target applies to individual accounting only")
    book = PrivacyLedger(ledger)
    dataset = dataset or Path(private_corpus).stem
    plan = plan_answer(rag_config, config.mechanism, config.answer_epsilon)
    if individual:  # before loading anything heavy
        check_document_target(book, dataset, document_target)
        plan.document_rho()  # icl with a zCDP curve, or ValueError with the reason
    else:
        require_collection_cap(book, dataset)  # before loading anything heavy
        check_answer_event(book, dataset, plan)
    model, prompt = load_answer_lm(lm) if lm == TINY_LM else (lm, None)  # FlaxLM: loaded later
    answers = None
    if reuse_answers is not None:
        from retriever.rag.reuse import ReleasedAnswers

        if reuse_answers == "shared" and not individual:
            raise ValueError(
                "--reuse-answers shared needs --accounting individual: under collection "
                "accounting a tenant's cap bounds what it learns (use tenant)"
            )
        answers = ReleasedAnswers(reuse_answers)
    first = load_dprag(
        index, private_corpus, lm=model, ledger=book, dataset=dataset, config=rag_config,
        prompt=prompt, encoder_independent_of_collection=encoder_independent_of_collection,
        document_target=document_target,
        answer_epsilon=config.answer_epsilon if individual else None,
        document_cache=document_cache, answers=answers, retrieval=retrieval,
        guarantees_add_up=guarantees_add_up,
    )  # fmt: skip
    if not individual:  # the filters' theorem needs no fixed event
        pin_answer_event(book, dataset, plan)  # atomic: a concurrent other shape is refused
    pool = [first] + [
        DPRag(
            first.doc_ids,
            first.texts,
            first.embeddings,
            first.encode_question,
            first.lm.fork(),
            payer=collection_payer(book, dataset),
            config=rag_config,
            prompt=first.prompt,
            document_cache=first.document_kv or False,  # computed once, shared
            answers=answers,
        )
        for _ in range(replicas - 1)
    ]
    public = None if public_index is None else PublicIndex(public_index, public_corpus)
    return Service(book, TenantRegistry(book), dataset, pool, public, config)


def check_individual(config: ServiceConfig, document_target: tuple[float, float] | None) -> None:
    """Refuses what individual accounting cannot serve, from public parameters only.

    Raises:
      ValueError: a mechanism other than icl (keywords and facts release a partition
        selection, with no zCDP curve for a per-document filter) or no per-document target.
    """
    if config.mechanism != "icl":
        raise ValueError(
            f"individual accounting answers with icl only, got mechanism {config.mechanism}: "
            "keywords' and facts' partition selections have no zCDP curve for a "
            "per-document filter"
        )
    if document_target is None:
        raise ValueError(
            "individual accounting needs each document's target: pass --document-epsilon "
            "and --document-delta"
        )


def check_document_target(
    ledger: PrivacyLedger, dataset: str, document_target: tuple[float, float]
) -> None:
    """Refuses, before anything heavy loads, a collection in collection accounting or one
    whose filters were opened with another per-document target.

    Raises:
      ValueError: `dataset` has a collection cap, or filters with another target.
    """
    refuse_collection_cap(ledger, dataset)
    record = DocumentFilters(ledger.store).get(dataset)
    epsilon, delta = map(float, document_target)
    if record is not None and (record.budget.epsilon, record.budget.delta) != (epsilon, delta):
        raise ValueError(
            f"{dataset}'s per-document filters target (epsilon={record.budget.epsilon:g}, "
            f"delta={record.budget.delta:g}), not (epsilon={epsilon:g}, delta={delta:g}): "
            "a collection's filters never change"
        )


def refuse_private_as_public(
    index: str | Path,
    private_corpus: str | Path,
    public_index: str | Path,
    public_corpus: str | Path,
) -> None:
    """Refuses a public corpus or index that is the private one (``/retrieve`` is free).

    A corpus with the private corpus's (doc_id, text) rows is the private collection
    whatever its file; the private index's folder, a copy of it (its recorded corpus digest)
    and an index that recorded none over the private doc_ids are the private index.

    Raises:
      ValueError: one line naming the option, never the content.
    """
    from retriever.data import read_corpus
    from retriever.index_folder import corpus_digest, read_index_meta

    private_ids, private_texts = read_corpus(private_corpus)
    private_digest = corpus_digest(private_ids, private_texts)
    if corpus_digest(*read_corpus(public_corpus)) == private_digest:
        raise ValueError(
            "--public-corpus is the private corpus (the same records, whatever the file): "
            "/retrieve is free and must read public or DP synthetic documents only"
        )
    meta = read_index_meta(public_index)
    recorded = meta.get("corpus_digest")  # none: written before indexes recorded it
    older_over_ids = recorded is None and list(map(str, meta["doc_ids"])) == private_ids
    same_folder = Path(index).resolve() == Path(public_index).resolve()
    if same_folder or recorded == private_digest or older_over_ids:
        raise ValueError(
            "--public-index is the private index (its folder, a copy, or an older index over "
            "its doc_ids): /retrieve must not search it"
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(service: Service, *, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serves until interrupted; prints ``serving http://HOST:PORT`` once listening."""
    import uvicorn

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    service_log = logging.getLogger("dpsynth.service")
    service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)
    service_log.propagate = False  # absl/jax may own the root logger
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(service),
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=10,
    )
    print(f"serving http://{host}:{bound} (pid {os.getpid()})", flush=True)
    uvicorn.Server(config).run(sockets=[sock])

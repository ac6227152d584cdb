"""Loads a `Service` from files and runs it under uvicorn on a socket it binds itself."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.prompts import PromptFormat
from retriever.service.app import Service, ServiceConfig, create_app, require_collection_cap
from retriever.service.public_index import PublicIndex
from retriever.service.tenants import TenantRegistry
from synthgen.privacy import PrivacyLedger

TINY_LM = "tiny"  # the byte-level test model (`synthgen.lm_backends.TinyLM`)


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
) -> Service:
    """The service over `private_corpus` (indexed exactly in `index`) and `ledger`.

    Before loading anything heavy it refuses a collection without a collection cap, a
    public corpus or index that is the private one, and an answer event other than the one
    the collection pinned; `load_dprag` refuses an encoder not known to be independent of
    the collection and δ caps of 1/n or more. Once loaded, the service pins its answer
    event on the collection cap (`retriever.rag.collection`).

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

    Raises:
      ValueError: bad arguments, the collection has no collection cap in the ledger, the
        public corpus or index is the private one, another answer event is pinned, or a
        check of `load_dprag` fails.

    Privacy:
      Every answer is `DPRag.answer` (one document, add/remove-one), the same event for
      every answer of the collection, whichever server charges it. ``/retrieve`` reads the
      public index only, so that index must not be the private collection's.
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
    book = PrivacyLedger(ledger)
    dataset = dataset or Path(private_corpus).stem
    require_collection_cap(book, dataset)  # before loading anything heavy
    plan = plan_answer(rag_config, config.mechanism, config.answer_epsilon)
    check_answer_event(book, dataset, plan)
    if lm == TINY_LM:
        from synthgen.lm_backends import TinyLM

        model, prompt = TinyLM(), PromptFormat(chat=False)
    else:
        model, prompt = lm, None
    first = load_dprag(
        index, private_corpus, lm=model, ledger=book, dataset=dataset, config=rag_config,
        prompt=prompt, encoder_independent_of_collection=encoder_independent_of_collection,
    )  # fmt: skip
    pin_answer_event(book, dataset, plan)  # atomic: a concurrent other shape is refused
    pool = [first] + [
        DPRag(
            first.doc_ids,
            first.texts,
            first.embeddings,
            first.encode_question,
            first.lm.fork(),
            ledger=book,
            dataset=dataset,
            config=rag_config,
            prompt=first.prompt,
        )
        for _ in range(replicas - 1)
    ]
    public = None if public_index is None else PublicIndex(public_index, public_corpus)
    return Service(book, TenantRegistry(book), dataset, pool, public, config)


def refuse_private_as_public(
    index: str | Path,
    private_corpus: str | Path,
    public_index: str | Path,
    public_corpus: str | Path,
) -> None:
    """Refuses a public corpus or index that is the private one (``/retrieve`` is free).

    The same resolved file, or a corpus with the same bytes (SHA-256), is the private
    collection whatever its name; so is the private index's folder.

    Raises:
      ValueError: one line naming the option, never the content.
    """
    from synthgen.corpora import file_sha256

    private, public = Path(private_corpus).resolve(), Path(public_corpus).resolve()
    if private == public or (
        private.is_file() and public.is_file() and file_sha256(private) == file_sha256(public)
    ):
        raise ValueError(
            "--public-corpus is the private corpus (same file or same content): /retrieve is "
            "free and must read public or DP synthetic documents only"
        )
    if Path(index).resolve() == Path(public_index).resolve():
        raise ValueError("--public-index is the private index: /retrieve must not search it")


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
    service_log = logging.getLogger("retriever.service")
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

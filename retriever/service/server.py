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
) -> Service:
    """The service over `private_corpus` (indexed exactly in `index`) and `ledger`.

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

    Raises:
      ValueError: bad arguments, or the collection has no collection cap in the ledger.
    """
    from retriever.rag.loading import load_dprag

    rag_config, config = rag_config or RagConfig(), config or ServiceConfig()

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas=}")
    if (public_index is None) != (public_corpus is None):
        raise ValueError("pass both --public-index and --public-corpus, or neither")
    book = PrivacyLedger(ledger)
    dataset = dataset or Path(private_corpus).stem
    require_collection_cap(book, dataset)  # before loading anything heavy
    if lm == TINY_LM:
        from synthgen.lm_backends import TinyLM

        model, prompt = TinyLM(), PromptFormat(chat=False)
    else:
        model, prompt = lm, None
    first = load_dprag(
        index, private_corpus, lm=model, ledger=book, dataset=dataset, config=rag_config,
        prompt=prompt,
    )  # fmt: skip
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

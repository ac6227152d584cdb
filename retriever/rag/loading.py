"""Builds a `DPRag` from an index folder (`retriever index build`) and its private corpus,
after checking what its guarantee assumes (`retriever.rag.collection`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from retriever.rag.answer import DPRag, RagConfig, plan_answer
from retriever.rag.collection import (
    PrivateCollection,
    check_delta,
    check_encoder,
    check_scope_deltas,
    open_document_filters,
    record_encoder_assertion,
    refuse_individual_assertion,
)
from retriever.rag.config import RETRIEVALS
from retriever.rag.prompts import PromptFormat
from synthgen.privacy import PrivacyLedger
from synthgen.privacy.ledger_documents import bind_texts
from synthgen.privacy.receipts import collection_payer

if TYPE_CHECKING:
    from retriever.rag.reuse import ReleasedAnswers


def load_dprag(
    index: str | Path,
    private_corpus: str | Path,
    *,
    lm: str | object = "smollm2-135m-instruct",
    ledger: PrivacyLedger | None = None,
    dataset: str | None = None,
    config: RagConfig | None = None,
    prompt: PromptFormat | None = None,
    encoder_independent_of_collection: bool = False,
    document_target: tuple[float, float] | None = None,
    answer_epsilon: float | None = None,
    document_cache: bool = False,
    answers: ReleasedAnswers | None = None,
    retrieval: str = "dense",
    guarantees_add_up: bool = False,
    collection: PrivateCollection | None = None,
) -> DPRag:
    """The answer stage over `private_corpus`, scored with the embeddings of `index`
    (``retrieval="dense"``) or by term overlap (``"overlap"``), after the checks of
    `retriever.rag.collection`, made before the encoder or the LM is loaded.

    Args:
      index: a folder of `retriever index build --kind exact` over the private corpus (DP
        retrieval scores every document), or, for overlap, one listing its documents.
      private_corpus: corpus.jsonl (doc_id, text), the same documents in the same order.
      lm: an LM asset name or path (loaded as `FlaxLM`), or a loaded `NextTokenLM`.
      ledger: the privacy ledger (None: nothing is charged; experiments and tests only).
      dataset: the collection's name in the ledger (default: the corpus file's stem).
      config, prompt, document_cache, answers: as `DPRag`'s.
      encoder_independent_of_collection: the operator's assertion where the encoder's
        provenance does not establish it (`check_encoder`); with a ledger it is recorded on
        the dataset's collection cap, which must exist. Refused in individual accounting.
      document_target, answer_epsilon: individual accounting: each document's (epsilon,
        delta) over all answers, and the default answer's epsilon, whose per-document rho
        the filters record as one answer's charge (`open_document_filters`).
      retrieval: "dense" or "overlap" (`retriever.lexical.OverlapEncoder`, words weighted
        by their token count under the LM).
      guarantees_add_up: bind `dataset` to the corpus's documents although other names
        have charged them (`PrivacyLedger.bind_documents`).
      collection: the corpus as a `PrivateCollection` that `PrivateCollection.admit` has
        admitted to `ledger`: its name and texts are used, its checks not repeated.

    Raises:
      FileNotFoundError: no index in the folder, or its encoder folder is not there.
      ValueError: an encoder whose provenance differs from the index's record or is not
        known to be independent of the collection; an index that is not exact or does
        not match the corpus; a δ (per answer or a scope's cap) of 1/n or more; other
        names have charged the documents (`SharedDocumentsError`).

    Privacy:
      Privacy unit: one document of the collection (add/remove-one), as `DPRag`. Its
      sensitivity arguments assume scores from an encoder that does not depend on the
      collection: from a public pretrained model that holds; from a DP-trained encoder
      the answers' guarantee composes with the encoder's when that release was made from
      this collection; otherwise it rests on the operator's assertion. δ < 1/n, as for
      DP-SGD. An overlap score depends on its document and the question alone.
    """
    from retriever.data import read_corpus
    from retriever.evaluate import load_towers
    from retriever.index_folder import load_index_searcher, read_index_meta

    if retrieval not in RETRIEVALS:
        raise ValueError(f"retrieval must be one of {RETRIEVALS}, got {retrieval=}")
    index, private_corpus = Path(index), Path(private_corpus)
    meta = read_index_meta(index)
    dataset = collection.name if collection is not None else dataset or private_corpus.stem
    config = config or RagConfig()
    encoder, assertion = checked_encoder(index, meta, retrieval, encoder_independent_of_collection)
    if config.individual:
        if ledger is None or document_target is None or answer_epsilon is None:
            raise ValueError(
                "individual accounting needs a ledger, the per-document target "
                "(--document-epsilon, --document-delta) and the answer's epsilon"
            )
        refuse_individual_assertion(assertion)
    if assertion is not None and ledger is not None and ledger.collection_scope(dataset) is None:
        record_encoder_assertion(ledger, dataset, assertion)  # refuses: no collection cap
    searcher = load_index_searcher(index) if retrieval == "dense" else None
    if retrieval == "dense" and getattr(searcher, "embeddings", None) is None:
        raise ValueError(
            f"{index} is a {searcher.kind} index; DP retrieval scores every document: build "
            "the private index with `retriever index build --kind exact`"
        )
    if collection is not None:
        doc_ids, texts = list(collection.doc_ids), list(collection.texts)
    else:
        doc_ids, texts = read_corpus(private_corpus)
    if list(map(str, meta["doc_ids"])) != doc_ids:
        raise ValueError(f"{index} was not built from {private_corpus} (doc_ids differ)")
    check_delta(config.delta, len(doc_ids), "the per-answer delta")
    filters = None
    if config.individual and collection is None:
        filters = dict(documents=len(doc_ids), epsilon=document_target[0],
                       delta=document_target[1], records=(doc_ids, texts),
                       plan=plan_answer(config, "icl", float(answer_epsilon)))  # fmt: skip
        open_document_filters(ledger, dataset, check_only=True, **filters)  # refuses first
    if ledger is not None and collection is None:  # before the filters or a scope is written
        bind_texts(ledger, dataset, texts, guarantees_add_up=guarantees_add_up)
    if filters is not None:
        open_document_filters(ledger, dataset, **filters)
    if ledger is not None:
        if collection is None:
            check_scope_deltas(ledger, dataset, len(doc_ids))
        if assertion is not None:
            record_encoder_assertion(ledger, dataset, assertion)
    if isinstance(lm, str | Path):
        from synthgen.lm_backends import FlaxLM

        lm = FlaxLM.load(str(lm))
    if retrieval == "overlap":
        overlap = overlap_encoder(texts, lm)
        embeddings, encode = overlap.documents(), overlap.encode
    else:
        embeddings, encode = searcher.embeddings, load_towers(encoder)[0].encode
    return DPRag(
        doc_ids,
        texts,
        embeddings,
        encode,
        lm,
        payer=None if ledger is None else collection_payer(ledger, dataset),
        config=config,
        prompt=prompt,
        document_cache=document_cache,
        answers=answers,
    )


def checked_encoder(
    index: Path, meta: dict, retrieval: str, asserted: bool
) -> tuple[str | None, str | None]:
    """(encoder, assertion): a dense index's encoder, checked against its ``index.json``
    (`meta`) and by `check_encoder` (`assertion`: the line to record when only the
    operator's assertion `asserted` makes it independent); (None, None) for overlap."""
    from retriever.index_folder import index_encoder

    if retrieval != "dense":
        return None, None
    encoder, _ = index_encoder(index, meta=meta, option=None)
    return encoder, check_encoder(encoder, asserted=asserted)


def overlap_encoder(texts, lm):
    """Term-overlap scoring of `texts` (`retriever.lexical.OverlapEncoder`: hashed words,
    a sparse document matrix of public width), each content word weighted by its token
    count under `lm` (a public rarity proxy)."""
    from retriever.lexical import OverlapEncoder

    return OverlapEncoder(texts, weight=lambda word: len(lm.encode(" " + word)))

"""Builds a `DPRag` from an index folder (`retriever index build`) and its private corpus."""

from __future__ import annotations

from pathlib import Path

from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.prompts import PromptFormat
from synthgen.privacy import PrivacyLedger


def load_dprag(
    index: str | Path,
    private_corpus: str | Path,
    *,
    lm: str | object = "smollm2-135m-instruct",
    ledger: PrivacyLedger | None = None,
    dataset: str | None = None,
    config: RagConfig | None = None,
    prompt: PromptFormat | None = None,
) -> DPRag:
    """The answer stage over `private_corpus`, scored with the embeddings of `index`.

    Args:
      index: a folder written by `retriever index build --kind exact` over the private
        corpus (DP retrieval scores every document, so the index must hold them all).
      private_corpus: corpus.jsonl (doc_id, text), the same documents in the same order.
      lm: an LM asset name or path (loaded as `FlaxLM`), or a loaded `NextTokenLM`.
      ledger: the privacy ledger.
      dataset: the collection's name in the ledger (default: the corpus file's stem).
      config: public parameters of the answer stage.
      prompt: prompt format.

    Raises:
      FileNotFoundError: no index in the folder.
      ValueError: the index is not exact or does not match the corpus.
    """
    from retriever.data import read_corpus
    from retriever.evaluate import load_towers
    from retriever.index_folder import load_index_searcher, read_index_meta

    index, private_corpus = Path(index), Path(private_corpus)
    meta = read_index_meta(index)
    searcher = load_index_searcher(index)
    if getattr(searcher, "embeddings", None) is None:
        raise ValueError(
            f"{index} is a {searcher.kind} index; DP retrieval scores every document: build "
            "the private index with `retriever index build --kind exact`"
        )
    doc_ids, texts = read_corpus(private_corpus)
    if list(map(str, meta["doc_ids"])) != doc_ids:
        raise ValueError(f"{index} was not built from {private_corpus} (doc_ids differ)")
    question_encoder, _ = load_towers(meta["encoder"])
    if isinstance(lm, str | Path):
        from synthgen.lm_backends import FlaxLM

        lm = FlaxLM.load(str(lm))
    return DPRag(
        doc_ids,
        texts,
        searcher.embeddings,
        question_encoder.encode,
        lm,
        ledger=ledger,
        dataset=dataset or private_corpus.stem,
        config=config or RagConfig(),
        prompt=prompt,
    )

"""The public/synthetic index behind ``/retrieve``: free to query, it holds no private text."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PublicIndex:
    """Top-k search over a public corpus with the index's own question encoder.

    Args:
      index: a folder written by `retriever index build` (any kind) over `corpus`.
      corpus: the public/synthetic corpus.jsonl (doc_id, text) of that index.

    Raises:
      FileNotFoundError: no index in the folder, or its encoder folder is not there.
      ValueError: the index was not built from `corpus` (other doc_ids, or other texts
        where the index recorded its corpus's digest); its encoder's provenance is not the
        one the index recorded (`retriever.index_folder.index_encoder`).
    """

    def __init__(self, index: str | Path, corpus: str | Path) -> None:
        from retriever.data import read_corpus
        from retriever.evaluate import load_towers
        from retriever.index_folder import (
            corpus_digest,
            index_encoder,
            load_index_searcher,
            read_index_meta,
        )

        index = Path(index)
        meta = read_index_meta(index)
        self.doc_ids, self.texts = read_corpus(corpus)
        if list(map(str, meta["doc_ids"])) != self.doc_ids:
            raise ValueError(f"{index} was not built from {corpus} (doc_ids differ)")
        recorded = meta.get("corpus_digest")  # none: written before indexes recorded it
        if recorded is not None and recorded != corpus_digest(self.doc_ids, self.texts):
            raise ValueError(f"{index} was not built from {corpus} (its texts differ)")
        encoder, _ = index_encoder(index, meta=meta, option=None)
        self.encoder, _ = load_towers(encoder)
        self.searcher = load_index_searcher(index)

    def search(self, question: str, k: int) -> list[dict[str, Any]]:
        """The `k` best public documents for `question`, best first."""
        scores, found = self.searcher.search(self.encoder.encode([question]), k)
        return [
            {"doc_id": self.doc_ids[i], "text": self.texts[i], "score": float(s)}
            for s, i in zip(scores[0], found[0])
            if i >= 0
        ]

"""What the network query engine does locally with what contributors released.

`Reranker` re-scores every merged hit with one local encoder (so that contributors' scores
from different indexes become comparable), and `local_answer` answers greedily from the top
documents with a local LM (`load_answer_lm`).

Privacy:
  Post-processing: both read only the contributors' released (DP) documents and the
  caller's question; nothing here reaches a private collection or is charged.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

TINY_LM = "tiny"


class Reranker:
    """Re-scores (question, document) pairs with one local encoder: inner products.

    Args:
      query_encoder: encodes questions (`retriever.encoders.TextEncoder`).
      doc_encoder: encodes documents (the same encoder unless it has a document tower).
      name: how responses name it.
    """

    def __init__(self, query_encoder: Any, doc_encoder: Any, name: str) -> None:
        self.query_encoder, self.doc_encoder, self.name = query_encoder, doc_encoder, name
        self._lock = threading.Lock()

    @classmethod
    def load(cls, encoder: str) -> Reranker:
        """An encoder asset, folder or trained checkpoint (`retriever.evaluate.load_towers`)."""
        from retriever.evaluate import encoder_label, load_towers

        query, doc = load_towers(encoder)
        return cls(query, doc, encoder_label(encoder))

    def scores(self, question: str, texts: Sequence[str]) -> list[float]:
        """<q, d> for each text: the same inner product as the indexes use."""
        import numpy as np

        if not texts:
            return []
        with self._lock:
            q = np.asarray(self.query_encoder.encode([question]), np.float32)[0]
            d = np.asarray(self.doc_encoder.encode(list(texts)), np.float32)
        return [float(s) for s in d @ q]


def load_answer_lm(name: str) -> tuple[Any, Any]:
    """(lm, prompt format) for local answers: an LM asset or path, or ``"tiny"``.

    ``"tiny"`` is the byte-level test model (`synthgen.lm_backends.TinyLM`) with a plain
    prompt; any other name loads `synthgen.lm_backends.FlaxLM` with a chat prompt.
    """
    from retriever.rag.prompts import PromptFormat

    if name == TINY_LM:
        from synthgen.lm_backends import TinyLM

        return TinyLM(), PromptFormat(chat=False)
    from synthgen.lm_backends import FlaxLM

    return FlaxLM.load(name), PromptFormat()


def local_answer(
    lm: Any,
    prompt: Any,
    question: str,
    texts: Sequence[str],
    *,
    max_tokens: int,
    max_document_tokens: int,
) -> str:
    """Greedy answer of `lm` to `question` over `texts` in one prompt (not DP: it reads
    only released synthetic documents, so it is post-processing)."""
    from retriever.rag.greedy import greedy_answer

    documents = [lm.encode(text)[:max_document_tokens] for text in texts]
    return greedy_answer(lm, prompt.encode(lm, question, documents), max_tokens)

"""A question stream answered without per-question privacy cost: release, RAG, no RAG.

`scripts/multi_query_eval.py`'s cells that spend nothing per answer: the one-time knowledge
release (`synthgen.knowledge`, read as ordinary RAG), non-private RAG over the private
records (the reference), and the LM alone (no RAG). Each answers the stream of
`dpsynth.evaluation.stream_eval.zipf_stream` in order; a question text asked again gets the
same greedy answer (computed once: the cells are deterministic), and each cell's rows go to
``<out>/streams/<name>.jsonl`` (resumable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dpsynth.evaluation.medical_world import Question, answer_is_correct
from dpsynth.evaluation.stream_eval import answer_rows, resume

SUPPORT_BINS = ((1, 4), (5, 14), (15, 29), (30, 99), (100, 10**9))


def support_bin(support: int) -> str:
    """The support bin of a question ("1-4", ..., "100+")."""
    for low, high in SUPPORT_BINS:
        if low <= support <= high:
            return f"{low}+" if high >= 10**9 else f"{low}-{high}"
    raise ValueError(f"support must be >= 1, {support=}")


def retrieval_answerer(
    lm,
    prompt,
    texts: Sequence[str],
    embeddings: np.ndarray,
    encode: Callable[[list[str]], np.ndarray],
    *,
    k: int = 8,
    max_tokens: int = 5,
    max_document_tokens: int = 64,
    retrieval: str = "dense",
) -> Callable[[str], str]:
    """Greedy RAG over `texts`: exact cosine top-k (``retrieval="dense"``) or BM25 top-k
    (``"bm25"``, `retriever.lexical`); k = 0 answers with no document."""
    from retriever.lexical import BM25
    from retriever.rag.greedy import greedy_answer

    if retrieval not in ("dense", "bm25"):
        raise ValueError(f"retrieval must be 'dense' or 'bm25', got {retrieval!r}")
    if k > 0 and len(texts):
        unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
        lexical = BM25(texts) if retrieval == "bm25" else None
    tokens = [lm.encode(t)[:max_document_tokens] for t in texts]

    def answer(question: str) -> str:
        docs = []
        if k > 0 and len(texts):
            if lexical is not None:
                top = lexical.search([question], k)[1][0]
            else:
                q = np.asarray(encode([question]), np.float64)[0]
                scores = unit @ (q / max(np.linalg.norm(q), 1e-12))
                top = np.argsort(-scores, kind="stable")[:k]
            docs = [tokens[int(i)] for i in top]
        return greedy_answer(lm, prompt.encode(lm, question, docs), max_tokens)

    return answer


def answer_stream(
    name: str,
    answer: Callable[[str], str],
    stream: Sequence[Question],
    *,
    out_dir: str | Path,
    others: Sequence[str],
    progress: bool = True,
) -> list[dict]:
    """Answers the stream in order (resuming), one row per question:
    index, disease, support, answer, correct, abstained (False), refused (False), seconds."""
    path, rows, todo = resume(out_dir, name, len(stream), progress)
    cache = {stream[r["index"]].question: r["answer"] for r in rows}

    def answer_once(q: Question) -> tuple[str, bool, dict]:
        if q.question not in cache:
            cache[q.question] = answer(q.question)
        text = cache[q.question]
        correct = answer_is_correct(text, q.answer, others=others)
        return text, correct, {"abstained": False, "refused": False}

    return rows + list(answer_rows(path, todo, stream, answer_once))


def accuracy_by_support(rows: Sequence[dict]) -> dict[str, float | None]:
    """Accuracy of the stream's questions in each support bin (None: no question there)."""
    out: dict[str, float | None] = {}
    for low, high in SUPPORT_BINS:
        label = support_bin(low)
        hits = [bool(r["correct"]) for r in rows if low <= r["support"] <= high]
        out[label] = float(np.mean(hits)) if hits else None
    return out

"""BM25: lexical retrieval for collections of rare exact words.

A dense encoder such as all-MiniLM-L6-v2 has never seen an invented disease or drug name:
its WordPiece fragments ("tad ##run ##ic") carry little of the word, and a synthetic
knowledge record that lists such words as keywords (`synthgen.knowledge`) is found by the
question's words, not by their meaning. BM25 scores exactly that: each query word that a
document holds, weighted by how rare the word is in the collection (Okapi BM25, Robertson
and Zaragoza 2009, the Lucene variant of idf). Scores are exact (a sparse matrix product),
ties are broken by document order, and the index is built from the texts alone, so a
release folder needs no extra file for it.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Sequence

import numpy as np

WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters and digits, any script)."""
    return WORD.findall(text.lower())


class BM25:
    """Okapi BM25 over `texts`, searched with `search(queries, k)` like `retriever.index`.

    Args:
      texts: the documents.
      k1: term-frequency saturation.
      b: length normalisation (0: none).
    """

    def __init__(self, texts: Sequence[str], *, k1: float = 1.2, b: float = 0.75) -> None:
        from scipy import sparse

        if k1 < 0 or not 0.0 <= b <= 1.0:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1: {k1=}, {b=}")
        tokens = [words(t) for t in texts]
        self.vocabulary: dict[str, int] = {}
        rows, cols, counts = [], [], []
        for i, doc in enumerate(tokens):
            for word in doc:
                self.vocabulary.setdefault(word, len(self.vocabulary))
            unique, tf = np.unique([self.vocabulary[w] for w in doc], return_counts=True)
            rows.extend([i] * len(unique))
            cols.extend(unique.tolist())
            counts.extend(tf.tolist())
        n = len(tokens)
        self.size = n
        lengths = np.array([len(doc) for doc in tokens], np.float64)
        tf = sparse.csr_matrix(
            (np.asarray(counts, np.float64), (rows, cols)), shape=(n, len(self.vocabulary))
        )
        df = np.bincount(np.asarray(cols, np.int64), minlength=len(self.vocabulary))
        self.idf = np.log1p((n - df + 0.5) / (df + 0.5))
        norm = k1 * (1.0 - b + b * lengths / max(lengths.mean(), 1e-12)) if n else lengths
        weighted = tf.tocoo()
        values = weighted.data * (k1 + 1.0) / (weighted.data + norm[weighted.row])
        values = values * self.idf[weighted.col]
        # [vocabulary, documents]: a query's score row is a sum of its words' rows
        self._weights = sparse.csr_matrix(
            (values, (weighted.col, weighted.row)), shape=(len(self.vocabulary), n)
        )

    def scores(self, query: str) -> np.ndarray:
        """[documents]: the BM25 score of every document for `query` (each word once)."""
        ids = sorted({self.vocabulary[w] for w in words(query) if w in self.vocabulary})
        if not ids:
            return np.zeros(self.size)
        return np.asarray(self._weights[ids].sum(axis=0)).ravel()

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k per query: (scores [Q, k], indices [Q, k]), best first, ties by index.

        k is clipped to the number of documents.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, {k=}")
        k = min(k, self.size)
        out_scores = np.zeros((len(queries), k))
        out_ids = np.zeros((len(queries), k), np.int64)
        for q, query in enumerate(queries):
            s = self.scores(query)
            top = np.argsort(-s, kind="stable")[:k]
            out_scores[q], out_ids[q] = s[top], top
        return out_scores, out_ids


# Words a question is phrased with, not what it asks about.
QUESTION_WORDS = frozenset(
    "a an the and or of in on at to for with by from as is are was were be it its this that "
    "which what who whom whose when where why how does do did can could should would will "
    "patient patients presents present presenting disease diseases diagnosis cause causes "
    "caused symptom symptoms".split()
)


GRID = 2.0**20  # an overlap weight share is a multiple of 1 / GRID: exact float32 sums
WIDTH = 2**20  # overlap vectors' width: public, whatever the collection (hashed words)


def bucket(word: str, width: int = WIDTH) -> int:
    """`word`'s coordinate in a `width`-wide overlap vector: its 64-bit BLAKE2b digest
    modulo `width`, the same in every process (Python's `hash` of a str is salted per
    process); unbiased for a power-of-two `width`."""
    digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % width


class _Buckets(dict):
    """word → `bucket(word, width)`, each word hashed once."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def __missing__(self, word: str) -> int:
        self[word] = value = bucket(word, self.width)
        return value


class OverlapEncoder:
    """Term-overlap scores as inner products, for DP retrieval over rare exact words.

    A document's vector marks the words it holds; a question's vector gives each of its
    content words (outside `QUESTION_WORDS`) a public weight, normalised to sum to 1. The
    inner product, the weighted share of the question's content words the document holds,
    lies in [0, 1] and depends on that document and the question alone (no idf), so a DP
    threshold over it has sensitivity 1 as over any per-document score.

    Fixed width (privacy rule 9): a word's coordinate is its BLAKE2b hash (`bucket`) modulo
    the public `width` (`WIDTH` = 2^20), so no shape depends on the collection's vocabulary;
    documents are a sparse CSR matrix of their distinct buckets. A collision costs quality,
    never privacy: a document marks a bucket once, so its score is still a function of it
    and the question alone, at least the exact overlap and at most 1. Exact bit for bit:
    shares are rounded down to multiples of 2^-20 (`GRID`), so every partial sum is exact
    in float32 whatever order the product adds in. Not covered: the product's time and the
    matrix's memory grow with documents + stored entries, the same for every question.
    See docs/guides/dp_rag.md (term overlap) and `scripts/overlap_scale.py`.

    Args:
      texts: the documents (their words set the stored entries only, never the shape).
      weight: public weight of a content word (default 1; e.g. its token count under a
        public tokenizer, so an invented name outweighs "spots").
      width: the vectors' width (public; tests use a small one to force collisions).
    """

    def __init__(self, texts: Sequence[str], weight=None, *, width: int = WIDTH) -> None:
        from scipy import sparse

        if not 1 <= width < 2**31:
            raise ValueError(f"width must be in [1, 2^31): {width=}")
        self.weight = weight or (lambda word: 1.0)
        self.width = width
        lookup = _Buckets(width).__getitem__  # each distinct word hashed once
        indices, indptr = array("i"), array("q", [0])  # C ints: 4 and 8 bytes an entry
        for text in texts:
            indices.extend(map(lookup, words(text)))
            indptr.append(len(indices))
        indices_np = np.frombuffer(indices, np.int32) if indices else np.zeros(0, np.int32)
        matrix = sparse.csr_matrix(
            (np.ones(len(indices_np), np.float32), indices_np, np.frombuffer(indptr, np.int64)),
            shape=(len(indptr) - 1, width),
        )
        matrix.sum_duplicates()  # sorted buckets per row; a repeated word or collision sums
        matrix.data[:] = 1.0  # ... and is marked once
        self._documents = matrix

    def documents(self):
        """[documents, `width`] 0/1 scipy.sparse CSR matrix (float32), each document's
        distinct buckets stored."""
        return self._documents

    def encode(self, questions: Sequence[str], **_) -> np.ndarray:
        """[questions, `width`]: each content word's weight over the total, rounded down
        to a multiple of 1 / `GRID`, added into its bucket (zeros: none)."""
        out = np.zeros((len(questions), self.width), np.float32)
        for q, question in enumerate(questions):
            content = {w for w in words(question) if w not in QUESTION_WORDS}
            weights = {w: float(self.weight(w)) for w in content}
            total = sum(weights.values())
            for word, value in weights.items():
                if total > 0:
                    out[q, bucket(word, self.width)] += np.floor(value / total * GRID) / GRID
        return out

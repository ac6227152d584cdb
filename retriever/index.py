"""Maximum inner product search over L2-normalised embeddings: numpy exact search and ScaNN.

Every index implements the `Searcher` protocol: ``search(queries, k)`` returns ``(scores,
indices)``, both ``[q, k]``, best first, the score being the inner product (the cosine, on
unit vectors). `ExactSearcher` (numpy, the oracle every test compares against) and
`ScannSearcher` (Guo et al. 2020, pybind API: brute force ``"scann-bf"`` or the
approximate tree + anisotropic hashing ``"scann"`` sized by `ScannParams.for_corpus`).
`build_searcher` picks one by name; `load_searcher` reads back what ``save`` wrote.

References:
  Guo, Sun, Lindgren, Geng, Simcha, Chern, Kumar. "Accelerating Large-Scale Inference with
  Anisotropic Vector Quantization", ICML 2020.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

KINDS = ("exact", "scann-bf", "scann", "auto")
# "auto" uses exact search below this many corpus rows: a BLAS matmul over fewer than 50k x d
# rows answers a query in well under a millisecond per query in batches, and it is exact.
AUTO_EXACT_MAX = 50_000
# Exact search scores at most this many (query, row) pairs at once (float32: 256 MiB).
EXACT_BLOCK_ELEMENTS = 1 << 26
META_FILE = "searcher.json"
EMBEDDINGS_FILE = "embeddings.npy"
FORMAT_VERSION = 1


@runtime_checkable
class Searcher(Protocol):
    """A maximum inner product index over a fixed corpus of ``size`` rows of ``dim`` floats."""

    kind: str
    size: int
    dim: int

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns float32 scores and int64 corpus row ids, both ``[q, min(k, size)]``.

        Rows are best first. An approximate searcher that finds fewer than k candidates pads
        the tail of the row with id -1 and score -inf.
        """
        ...

    def save(self, directory: str | Path) -> None:
        """Writes the index to `directory` (created) for `load_searcher`."""
        ...


def _check_matrix(array: Any, name: str) -> np.ndarray:
    """Returns `array` as a C-contiguous float32 ``[rows, dim]`` matrix or raises ValueError."""
    array = np.asarray(array)
    shape = array.shape
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [rows, dim] array, got {shape=}")
    if not np.issubdtype(array.dtype, np.floating):
        dtype = array.dtype
        raise ValueError(f"{name} must be a float array, got {dtype=}")
    if shape[1] == 0:
        raise ValueError(f"{name} must have at least one column, got {shape=}")
    return np.ascontiguousarray(array, dtype=np.float32)


def _check_corpus(embeddings: Any) -> np.ndarray:
    embeddings = _check_matrix(embeddings, "embeddings")
    size = embeddings.shape[0]
    if size == 0:
        raise ValueError(f"the corpus must not be empty, got {size=}")
    return embeddings


def _check_queries(queries: Any, dim: int) -> np.ndarray:
    queries = _check_matrix(queries, "queries")
    query_dim = queries.shape[1]
    if query_dim != dim:
        raise ValueError(f"queries must have the corpus dimension {dim}, got {query_dim=}")
    return queries


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k=}")
    return int(k)


def _write_meta(directory: Path, kind: str, size: int, dim: int, params: dict) -> None:
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "size": size,
        "dim": dim,
        "params": params,
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _top_k_unsorted(scores: np.ndarray, k: int) -> np.ndarray:
    """Column ids of the k largest entries of each row of `scores` ``[b, n]``, k < n, unsorted."""
    n = scores.shape[1]
    kth = np.partition(scores, n - k, axis=1)[:, n - k]
    rows, cols = np.nonzero(scores >= kth[:, None])
    # Exactly k ids a row unless a tie at the k-th score (or a NaN) makes the row ragged.
    if np.all(np.bincount(rows, minlength=scores.shape[0]) == k):
        return cols.reshape(-1, k)
    return np.argpartition(scores, n - k, axis=1)[:, n - k :]


class ExactSearcher:
    """Exact maximum inner product search in numpy: the oracle.

    Queries are scored in blocks of at most ``EXACT_BLOCK_ELEMENTS // size`` rows (one BLAS
    matmul per block, so the score matrix stays under 256 MiB whatever the number of queries).
    Each row's top k is then selected and only those k are sorted. The selection is
    `np.partition` on the scores, which finds the k-th largest score of each row (SIMD-sorted
    in numpy >= 2, several times faster than `np.argpartition`), then the ids whose score is at
    least that; when a tie at the k-th score gives a row more than k such ids, the block falls
    back to `np.argpartition`.

    ``k`` larger than the corpus is clamped to the corpus size: the result then has ``size``
    columns (every row, ranked) rather than padding.

    Attributes:
      kind: ``"exact"``.
      size: number of corpus rows.
      dim: embedding dimension.
      embeddings: the float32 ``[size, dim]`` corpus.
    """

    kind = "exact"

    def __init__(self, embeddings: np.ndarray, *, block_elements: int = EXACT_BLOCK_ELEMENTS):
        """Wraps `embeddings` (float32 ``[n, d]``, n >= 1; copied only if not float32 C-order).

        Args:
          embeddings: the corpus, one L2-normalised row per document.
          block_elements: upper bound on query rows x corpus rows scored at once.

        Raises:
          ValueError: on a non-2-D, non-float or empty corpus, or ``block_elements < 1``.
        """
        self.embeddings = _check_corpus(embeddings)
        if block_elements < 1:
            raise ValueError(f"block_elements must be >= 1, got {block_elements=}")
        self.size, self.dim = self.embeddings.shape
        self.block_size = max(1, block_elements // self.size)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns the exact top-k inner products and row ids of each query, best first.

        Args:
          queries: float ``[q, dim]``.
          k: neighbours per query (>= 1; clamped to `size`).

        Returns:
          ``(scores, indices)``: float32 and int64, both ``[q, min(k, size)]``. Ties are broken
          arbitrarily.

        Raises:
          ValueError: on malformed queries or k.
        """
        queries = _check_queries(queries, self.dim)
        k = min(_check_k(k), self.size)
        num_queries = queries.shape[0]
        scores = np.empty((num_queries, k), np.float32)
        indices = np.empty((num_queries, k), np.int64)
        for start in range(0, num_queries, self.block_size):
            stop = min(start + self.block_size, num_queries)
            block = queries[start:stop] @ self.embeddings.T  # [b, n], one BLAS call
            if k < self.size:
                top = _top_k_unsorted(block, k)
            else:
                top = np.broadcast_to(np.arange(self.size), block.shape)
            top_scores = np.take_along_axis(block, top, axis=1)
            order = np.argsort(-top_scores, axis=1, kind="stable")
            scores[start:stop] = np.take_along_axis(top_scores, order, axis=1)
            indices[start:stop] = np.take_along_axis(top, order, axis=1)
        return scores, indices

    def save(self, directory: str | Path) -> None:
        """Writes ``embeddings.npy`` and ``searcher.json`` to `directory` (created)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / EMBEDDINGS_FILE, self.embeddings)
        _write_meta(directory, self.kind, self.size, self.dim, {})

    @classmethod
    def load(cls, directory: str | Path) -> ExactSearcher:
        """Reads a searcher written by `save`."""
        return cls(np.load(Path(directory) / EMBEDDINGS_FILE))


@dataclasses.dataclass(frozen=True)
class ScannParams:
    """ScaNN tree + asymmetric hashing (AH) + reordering settings.

    Attributes:
      num_leaves: k-means partitions of the corpus; 0 for no tree (score every row).
      num_leaves_to_search: partitions scored per query (default for `search`).
      spherical: spherical k-means (unit-norm centroids, so a query picks leaves by inner
        product with comparable centroids); the right tree for L2-normalised embeddings.
      training_sample_size: rows sampled to train the tree and the AH codebooks.
      use_ah: score with asymmetric hashing (4-bit codes, LUT16); False for float brute force.
      dimensions_per_block: dimensions per AH sub-space (2: 16 centres per 2 dims).
      anisotropic_quantization_threshold: AH score-aware loss threshold (Guo et al., 2020);
        NaN for plain (isotropic) quantization.
      reorder: candidates re-scored in float32 after AH (at search time at least ``10 * k``).
    """

    num_leaves: int = 0
    num_leaves_to_search: int = 0
    spherical: bool = True
    training_sample_size: int = 250_000
    use_ah: bool = True
    dimensions_per_block: int = 2
    anisotropic_quantization_threshold: float = 0.2
    reorder: int = 250

    def __post_init__(self):
        if self.num_leaves < 0:
            raise ValueError(f"num_leaves must be >= 0, got {self.num_leaves=}")
        if self.num_leaves and not 1 <= self.num_leaves_to_search <= self.num_leaves:
            raise ValueError(
                f"num_leaves_to_search must be in [1, num_leaves], got {self.num_leaves_to_search=}"
            )
        if self.training_sample_size < 1:
            raise ValueError(f"training_sample_size must be >= 1, got {self.training_sample_size=}")
        if self.dimensions_per_block < 1:
            raise ValueError(f"dimensions_per_block must be >= 1, got {self.dimensions_per_block=}")
        if self.reorder < 1:
            raise ValueError(f"reorder must be >= 1, got {self.reorder=}")

    @classmethod
    def for_corpus(cls, size: int) -> ScannParams:
        """Derives the settings from the corpus size n.

        Tuned for recall@10 >= 0.95 on 1M x 384 clustered unit vectors
        (``scripts/bench_index.py``): below 1,000 rows float brute force (codebooks on so few
        rows cost more than they save); below 10,000 AH over every row; above, a spherical
        tree of about sqrt(n) leaves (clamped to [100, 4,000]) searching a tenth of them, at
        least 20: a fiftieth already reached recall@10 0.996 on the benchmark, and the tenth
        leaves margin for less clustered corpora at about 1/3 of the speed. The AH and
        reordering settings are the `ScannParams` defaults; the sample is at most 250,000.

        Args:
          size: number of corpus rows (>= 1).

        Returns:
          The derived parameters.

        Raises:
          ValueError: if ``size < 1``.
        """
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size=}")
        sample = min(size, 250_000)
        if size < 1_000:
            return cls(training_sample_size=sample, use_ah=False)
        if size < 10_000:
            return cls(training_sample_size=sample)
        num_leaves = int(min(max(round(math.sqrt(size)), 100), 4_000))
        to_search = max(20, math.ceil(num_leaves / 10))
        return cls(num_leaves, to_search, training_sample_size=sample)


class ScannSearcher:
    """ScaNN maximum inner product search (pybind API, dot-product distance).

    ``kind="scann-bf"`` scores every row in float32 (exact up to rounding); ``kind="scann"``
    uses `ScannParams` (by default `ScannParams.for_corpus`): a k-means tree, AH scoring of the
    rows in the searched leaves, then float32 reordering of the best candidates, so the returned
    scores are the true inner products of the returned rows.

    Batches of queries are searched with ScaNN's own thread pool (``search_batched_parallel``),
    as numpy's BLAS uses every core for the exact search. ``k`` larger than the corpus is
    clamped to the corpus size.

    Attributes:
      kind: ``"scann"`` or ``"scann-bf"``.
      size: number of corpus rows.
      dim: embedding dimension.
      params: the `ScannParams` (None for ``"scann-bf"``).
      scann: the wrapped ``scann_ops_pybind.ScannSearcher``.
    """

    def __init__(self, scann: Any, *, kind: str, size: int, dim: int, params: ScannParams | None):
        """Wraps a built or loaded ScaNN searcher; use `build` or `load` instead."""
        self.scann = scann
        self.kind = kind
        self.size = size
        self.dim = dim
        self.params = params

    @classmethod
    def build(
        cls,
        embeddings: np.ndarray,
        *,
        kind: str = "scann",
        params: ScannParams | None = None,
        num_neighbors: int = 10,
    ) -> ScannSearcher:
        """Builds (trains) a ScaNN index over `embeddings`.

        Args:
          embeddings: float ``[n, d]`` corpus, n >= 1, rows L2-normalised.
          kind: ``"scann"`` (tree + AH + reordering) or ``"scann-bf"`` (float brute force).
          params: ``"scann"`` settings; default `ScannParams.for_corpus(n)`.
          num_neighbors: the searcher's default k (`search` passes its own k).

        Returns:
          The searcher.

        Raises:
          ValueError: on a malformed corpus, an unknown kind, or params with ``"scann-bf"``.
        """
        from scann.scann_ops.py import scann_ops_pybind

        embeddings = _check_corpus(embeddings)
        size, dim = embeddings.shape
        num_neighbors = min(_check_k(num_neighbors), size)
        builder = scann_ops_pybind.builder(embeddings, num_neighbors, "dot_product")
        if kind == "scann-bf":
            if params is not None:
                raise ValueError(f"scann-bf takes no params, got {params=}")
            builder = builder.score_brute_force()
        elif kind == "scann":
            params = params or ScannParams.for_corpus(size)
            sample = min(size, params.training_sample_size)
            if params.num_leaves:
                builder = builder.tree(
                    num_leaves=min(params.num_leaves, size),
                    num_leaves_to_search=min(params.num_leaves_to_search, size),
                    training_sample_size=sample,
                    spherical=params.spherical,
                )
            if params.use_ah:
                builder = builder.score_ah(
                    params.dimensions_per_block,
                    anisotropic_quantization_threshold=params.anisotropic_quantization_threshold,
                    training_sample_size=sample,
                ).reorder(min(params.reorder, size))
            else:
                builder = builder.score_brute_force()
        else:
            raise ValueError(f"kind must be 'scann' or 'scann-bf', got {kind=}")
        return cls(builder.build(), kind=kind, size=size, dim=dim, params=params)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns the top-k inner products and row ids of each query, best first.

        Arguments, result and errors as in `ExactSearcher.search`, except that with a tree a
        query whose searched leaves hold fewer than k rows gets id -1 and score -inf in the
        missing tail.
        """
        queries = _check_queries(queries, self.dim)
        k = min(_check_k(k), self.size)
        if queries.shape[0] == 0:
            return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
        kwargs: dict[str, int] = {"final_num_neighbors": k}
        params = self.params
        if params is not None and params.use_ah:
            kwargs["pre_reorder_num_neighbors"] = min(max(params.reorder, 10 * k), self.size)
        if params is not None and params.num_leaves:
            kwargs["leaves_to_search"] = params.num_leaves_to_search
        indices, scores = self.scann.search_batched_parallel(queries, **kwargs)
        scores = np.asarray(scores, np.float32)
        indices = np.asarray(indices, np.int64)
        # ScaNN pads rows whose searched leaves hold fewer than k rows with (0, NaN).
        missing = np.isnan(scores)
        scores[missing] = -np.inf
        indices[missing] = -1
        return scores, indices

    def save(self, directory: str | Path) -> None:
        """Serialises the ScaNN assets (relative paths) and ``searcher.json`` to `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.scann.serialize(str(directory), relative_path=True)
        params = dataclasses.asdict(self.params) if self.params is not None else {}
        _write_meta(directory, self.kind, self.size, self.dim, params)

    @classmethod
    def load(cls, directory: str | Path) -> ScannSearcher:
        """Reads a searcher written by `save`."""
        from scann.scann_ops.py import scann_ops_pybind

        meta = _read_meta(directory)
        params = ScannParams(**meta["params"]) if meta["kind"] == "scann" else None
        scann = scann_ops_pybind.load_searcher(str(directory))
        return cls(scann, kind=meta["kind"], size=meta["size"], dim=meta["dim"], params=params)


def _read_meta(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {META_FILE} in {directory}: not a saved searcher")
    meta = json.loads(path.read_text(encoding="utf-8"))
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported searcher format, expected {FORMAT_VERSION}, got {version=}")
    return meta


def build_searcher(embeddings: np.ndarray, kind: str = "auto") -> Searcher:
    """Builds a searcher of the given kind over `embeddings`.

    Args:
      embeddings: float ``[n, d]`` corpus, n >= 1, rows L2-normalised.
      kind: ``"exact"`` (`ExactSearcher`), ``"scann-bf"``, ``"scann"`` (`ScannSearcher`, with
        `ScannParams.for_corpus`), or ``"auto"``: exact when n <= ``AUTO_EXACT_MAX`` (50,000),
        where a BLAS matmul is fast and exact, else ``"scann"``.

    Returns:
      The searcher.

    Raises:
      ValueError: on an unknown kind or a malformed corpus.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind=}")
    embeddings = _check_corpus(embeddings)
    if kind == "auto":
        kind = "exact" if embeddings.shape[0] <= AUTO_EXACT_MAX else "scann"
    if kind == "exact":
        return ExactSearcher(embeddings)
    return ScannSearcher.build(embeddings, kind=kind)


def load_searcher(directory: str | Path) -> Searcher:
    """Reads back any searcher written by its ``save(directory)``.

    Raises:
      FileNotFoundError: if `directory` holds no ``searcher.json``.
      ValueError: on an unknown format version or kind.
    """
    kind = _read_meta(directory)["kind"]
    if kind == "exact":
        return ExactSearcher.load(directory)
    if kind in ("scann", "scann-bf"):
        return ScannSearcher.load(directory)
    raise ValueError(f"unknown searcher kind in {META_FILE}, got {kind=}")

"""QPS and recall@10 of numpy exact search, ScaNN brute force and ScaNN tree-AH.

Two corpora, each searched by the three `retriever.index` searchers:

* wiki (skip with ``--skip-wiki``): the wiki summaries' documents as the corpus and their short
  descriptions as queries, encoded by `retriever.encoders` (all-MiniLM-L6-v2, 384-d;
  documents at 128 tokens, the one-line descriptions at 32, which truncates none of them).
  The embeddings are cached under ``runs/bench_index/`` keyed by model, size and length, so
  reruns skip the encoder.
* synthetic: ``--n`` (default 1,000,000) x 384 float32 unit vectors from a mixture of 1,000
  Gaussian clusters of uneven sizes and spreads, and ``--queries`` queries drawn near random
  corpus rows (fixed seeds).

For each searcher: build seconds; queries per second, the best of ``--repeats`` searches of the
same ``--timing-queries`` queries after a warm-up call (best of, because the machine may be
shared); and recall@10 over all queries against the exact top 10. Exact search is a BLAS
matmul per block of queries plus `np.argpartition`; ScaNN searches the batch with its own
thread pool; both run in this one process and use every core. The QPS of the exact search's
matmuls alone is printed too: no exact method built on the same BLAS call can beat it.
Compare figures within one run.

The last line is exactly ``scann_recall_at_10=<value> scann_vs_exact_qps=<ratio>`` for the
synthetic corpus (tree-AH against numpy exact).

    python scripts/bench_index.py --skip-wiki             # 1M synthetic (a few minutes)
    python scripts/bench_index.py --n 50000 --queries 200 --skip-wiki   # smoke run
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from retriever import index

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ROOT / "runs" / "bench_index"
WIKI_MODEL = "all-minilm-l6-v2"
K = 10


def clustered_unit_vectors(
    n: int,
    num_queries: int,
    *,
    dim: int = 384,
    num_clusters: int = 1_000,
    query_noise: float = 0.5,
    seed: int = 0,
    chunk: int = 100_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(corpus [n, dim], queries [num_queries, dim])``, float32, rows of unit norm.

    Cluster centres are random unit vectors; cluster c has weight ~ lognormal(0, 1) and spread
    sigma_c ~ U(0.5, 1.0); a row of cluster c is ``centre_c + sigma_c * z / sqrt(dim)`` with z
    standard normal (noise of norm about sigma_c), normalised. A query is a random corpus row
    plus noise of norm about `query_noise`, normalised. Generated in chunks of `chunk` rows
    (float32 throughout), so peak memory is about the corpus itself.
    """
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = rng.lognormal(0.0, 1.0, num_clusters)
    spreads = (rng.uniform(0.5, 1.0, num_clusters) / np.sqrt(dim)).astype(np.float32)
    labels = rng.choice(num_clusters, size=n, p=weights / weights.sum())
    corpus = np.empty((n, dim), np.float32)
    for start in range(0, n, chunk):
        rows = slice(start, min(start + chunk, n))
        block = rng.standard_normal((rows.stop - rows.start, dim), dtype=np.float32)
        block *= spreads[labels[rows], None]
        block += centres[labels[rows]]
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        corpus[rows] = block
    picks = rng.integers(0, n, num_queries)
    noise = rng.standard_normal((num_queries, dim), dtype=np.float32)
    queries = corpus[picks] + np.float32(query_noise / np.sqrt(dim)) * noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return corpus, queries


def wiki_embeddings(limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Encodes (or reads from the cache) the wiki documents and queries."""
    from synthgen import corpora

    ds = corpora.load_wiki_summaries(limit=limit)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    out = []
    encoder = None
    for column, max_len in (("document", 128), ("query", 32)):
        path = CACHE_DIR / f"wiki-{WIKI_MODEL}-n{len(ds)}-{column}-len{max_len}.npy"
        if not path.is_file():
            if encoder is None:
                from retriever.encoders import load_encoder  # lazy: only this case needs it

                encoder = load_encoder(WIKI_MODEL)
            emb = encoder.encode(ds[column], batch_size=64, max_len=max_len, progress=True)
            np.save(path, np.asarray(emb, np.float32))
        out.append(np.load(path))
    return out[0], out[1]


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found row ∩ truth row| / k."""
    hits = sum(len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist()))
    return hits / truth.size


def _best_qps(fn: Callable[[], object], num_queries: int, repeats: int) -> float:
    """Queries per second of the fastest of `repeats` calls of `fn` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return num_queries / min(times)


def _matmul_only(searcher: index.ExactSearcher, queries: np.ndarray) -> None:
    """The exact search's matmuls alone, same blocks, no top-k."""
    for lo in range(0, len(queries), searcher.block_size):
        _ = queries[lo : lo + searcher.block_size] @ searcher.embeddings.T


def run_case(
    name: str, corpus: np.ndarray, queries: np.ndarray, *, timing_queries: int, repeats: int
) -> dict[str, dict]:
    """Builds and times the three searchers; prints and returns one row per searcher.

    Recall is over all `queries`; QPS is the best of `repeats` searches of the first
    `timing_queries` queries, the same batch for every searcher.
    """
    timed = queries[:timing_queries]
    print(
        f"[{name}] corpus {corpus.shape}, {len(queries)} queries "
        f"(timing: best of {repeats} x {len(timed)} queries)",
        flush=True,
    )
    builders: dict[str, Callable[[], index.Searcher]] = {
        "exact": lambda: index.ExactSearcher(corpus),
        "scann-bf": lambda: index.ScannSearcher.build(corpus, kind="scann-bf"),
        "scann": lambda: index.ScannSearcher.build(corpus, kind="scann"),
    }
    rows: dict[str, dict] = {}
    truth = None
    for kind, build in builders.items():
        start = time.perf_counter()
        searcher = build()
        build_s = time.perf_counter() - start
        qps = _best_qps(lambda s=searcher: s.search(timed, K), len(timed), repeats)
        _, ids = searcher.search(queries, K)
        truth = ids if truth is None else truth  # exact runs first
        rows[kind] = {"build_s": build_s, "qps": qps, "recall": recall_at_k(ids, truth)}
        extra = f" params={searcher.params}" if getattr(searcher, "params", None) else ""
        print(
            f"[{name}] {kind:8s} build={build_s:7.2f}s qps={qps:9.1f} "
            f"recall@{K}={rows[kind]['recall']:.4f}{extra}",
            flush=True,
        )
        if isinstance(searcher, index.ExactSearcher):
            bound = _best_qps(lambda s=searcher: _matmul_only(s, timed), len(timed), repeats)
            print(f"[{name}] exact matmul alone (no top-k): qps={bound:9.1f}", flush=True)
        del searcher
    ratio = rows["scann"]["qps"] / rows["exact"]["qps"]
    print(f"[{name}] scann vs exact: {ratio:.1f}x qps", flush=True)
    return rows


def report_training_throughput(pairs: int = 256, batch_size: int = 32) -> None:
    """Pairs/s of `retriever.train.train_retriever` (all-MiniLM-L6-v2, in-batch softmax,
    queries 32 / documents 128 tokens) over `pairs // batch_size` steps on real wiki pairs,
    one jit compilation included (a lower bound on the steady-state rate)."""
    from retriever.encoders import load_encoder
    from retriever.train import RetrieverConfig, train_retriever
    from synthgen import corpora

    ds = corpora.load_wiki_summaries(limit=pairs)
    config = RetrieverConfig(batch_size=batch_size, epochs=1, max_doc_len=128)
    encoder = load_encoder("all-minilm-l6-v2")
    result = train_retriever(encoder, ds["query"], ds["document"], config, progress=False)
    print(
        f"[train] in-batch softmax, MiniLM, batch {batch_size}: {result.pairs_per_second:.1f} "
        f"pairs/s over {result.steps_run} steps (compile included)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="synthetic corpus rows")
    parser.add_argument("--queries", type=int, default=1_000, help="synthetic queries")
    parser.add_argument("--dim", type=int, default=384, help="synthetic dimension")
    parser.add_argument(
        "--timing-queries", type=int, default=500, help="queries per timed search (a prefix)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed searches; best counts")
    parser.add_argument("--skip-wiki", action="store_true", help="skip the encoded wiki corpus")
    parser.add_argument("--wiki-limit", type=int, default=None, help="first N wiki entries")
    args = parser.parse_args()
    for flag in ("n", "queries", "timing_queries", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    timing = {"timing_queries": args.timing_queries, "repeats": args.repeats}

    if not args.skip_wiki:
        docs, wiki_queries = wiki_embeddings(args.wiki_limit)
        run_case("wiki", docs, wiki_queries, **timing)
        del docs, wiki_queries
    report_training_throughput()

    start = time.perf_counter()
    corpus, queries = clustered_unit_vectors(args.n, args.queries, dim=args.dim)
    print(f"[synthetic] generated in {time.perf_counter() - start:.1f}s", flush=True)
    rows = run_case("synthetic", corpus, queries, **timing)
    ratio = rows["scann"]["qps"] / rows["exact"]["qps"]
    print(f"scann_recall_at_10={rows['scann']['recall']:.4f} scann_vs_exact_qps={ratio:.2f}")


if __name__ == "__main__":
    main()

"""Ranking metrics with binary relevance: NDCG@k, Recall@k, MRR@k.

Each query has a set of relevant document ids (the plain query format has one relevant
document per line; lines that share the query text are grouped into one query with several
relevant documents, see `group_queries`). For a ranking r_1, r_2, ... of document ids:

* DCG@k = sum over ranks i <= k with r_i relevant of 1 / log2(i + 1); NDCG@k divides by the
  DCG of the ideal ranking, ``sum_{i <= min(|rel|, k)} 1 / log2(i + 1)`` (as in BEIR/pytrec_eval
  with binary judgements);
* Recall@k = ``|rel ∩ top k| / |rel|``;
* MRR@k = 1 / (rank of the first relevant document) if it is within the top k, else 0.

Scores are averaged over queries (macro average).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def group_queries(rows: Iterable[dict]) -> tuple[list[str], list[set[str]]]:
    """Groups {"query", "doc_id"} rows by query text, keeping first-seen order.

    Returns:
      (queries, relevant): the distinct query texts and, for each, its relevant doc ids.
    """
    relevant: dict[str, set[str]] = {}
    for row in rows:
        relevant.setdefault(row["query"], set()).add(str(row["doc_id"]))
    return list(relevant), list(relevant.values())


def query_metrics(ranking: Sequence[str], relevant: set[str], k: int = 10) -> dict[str, float]:
    """NDCG@k, Recall@k and MRR@k of one ranking (best first) against its relevant ids."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k=}")
    if not relevant:
        raise ValueError("a query needs at least one relevant document")
    top = list(ranking)[:k]
    hits = [i for i, doc in enumerate(top, start=1) if doc in relevant]
    dcg = sum(1.0 / math.log2(i + 1) for i in hits)
    ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(relevant), k) + 1))
    return {
        f"ndcg@{k}": dcg / ideal,
        f"recall@{k}": len(hits) / len(relevant),
        f"mrr@{k}": 1.0 / hits[0] if hits else 0.0,
    }


def ranking_metrics(
    rankings: Sequence[Sequence[str]],
    relevant: Sequence[set[str]],
    k: int = 10,
    *,
    per_query: bool = False,
) -> dict:
    """Mean NDCG@k, Recall@k, MRR@k over queries, plus `num_queries` (and, with
    `per_query`, ``"per_query"``: each metric's value for every query, in query order).

    Raises:
      ValueError: no queries, or rankings and relevance sets of different lengths.
    """
    if len(rankings) != len(relevant):
        raise ValueError(f"{len(rankings)=} rankings for {len(relevant)=} relevance sets")
    if not rankings:
        raise ValueError("no queries to evaluate")
    values = [query_metrics(r, rel, k) for r, rel in zip(rankings, relevant, strict=True)]
    out: dict = {name: sum(m[name] for m in values) / len(values) for name in values[0]}
    out["num_queries"] = len(values)
    if per_query:
        out["per_query"] = {name: [m[name] for m in values] for name in values[0]}
    return out


def bootstrap_interval(
    statistic, *samples: Sequence[float], reps: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic(*means)` over queries (Efron 1979).

    Every sample is one value per query, in the same query order; each replicate resamples
    the queries with replacement, the same draw for every sample (a paired bootstrap), and
    applies `statistic` to the samples' means. Seeded: the same inputs give the same interval.
    """
    import numpy as np

    arrays = [np.asarray(s, np.float64) for s in samples]
    n = len(arrays[0])
    if n == 0 or any(len(a) != n for a in arrays):
        raise ValueError("the samples must be non-empty and have one value per query each")
    draws = np.random.default_rng(seed).integers(0, n, size=(reps, n))
    stats = np.array([statistic(*(a[d].mean() for a in arrays)) for d in draws])
    tail = (1 - level) / 2 * 100
    return float(np.percentile(stats, tail)), float(np.percentile(stats, 100 - tail))


def validation_split(num_queries: int, *, seed: int = 1) -> tuple[list[int], list[int]]:
    """Halves of the held-out queries: (validation, test) query positions, each sorted.

    Settings (which lever, which schedule) are chosen by their NDCG on the validation half and
    reported on the test half, so the reported figure is not the maximum over noisy test
    figures. The split is a fixed, public permutation (`seed`) of the query positions
    (`group_queries` order).

    Args:
      num_queries: held-out queries (distinct, as `group_queries` counts them).
      seed: the permutation's public seed.

    Returns:
      (validation positions, test positions): the validation half has num_queries // 2.

    Raises:
      ValueError: fewer than two queries.
    """
    import numpy as np

    if num_queries < 2:
        raise ValueError(f"a validation split needs >= 2 queries, got {num_queries=}")
    order = np.random.default_rng(seed).permutation(num_queries)
    half = num_queries // 2
    return sorted(order[:half].tolist()), sorted(order[half:].tolist())

"""Ranking metrics computed by hand for known rankings."""

import math

import numpy as np
import pytest

from retriever import metrics
from retriever.metrics import bootstrap_interval, ranking_metrics, validation_split


def test_single_relevant_document_at_rank_three():
    m = metrics.query_metrics(["a", "b", "x", "c"], {"x"}, k=10)
    assert m["ndcg@10"] == pytest.approx(1 / math.log2(4))  # 0.5
    assert m["recall@10"] == 1.0
    assert m["mrr@10"] == pytest.approx(1 / 3)


def test_miss_beyond_k_scores_zero():
    ranking = [f"d{i}" for i in range(20)]
    m = metrics.query_metrics(ranking, {"d10"}, k=10)  # rank 11
    assert m == {"ndcg@10": 0.0, "recall@10": 0.0, "mrr@10": 0.0}
    m5 = metrics.query_metrics(ranking, {"d3"}, k=5)
    assert m5["mrr@5"] == pytest.approx(1 / 4)


def test_two_relevant_documents():
    # Relevant at ranks 1 and 3 of 2 relevant: DCG = 1 + 1/log2(4) = 1.5,
    # IDCG = 1 + 1/log2(3).
    m = metrics.query_metrics(["x", "a", "y"], {"x", "y"}, k=10)
    assert m["ndcg@10"] == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert m["recall@10"] == 1.0 and m["mrr@10"] == 1.0
    # Only one of two found.
    m = metrics.query_metrics(["a", "y"], {"x", "y"}, k=10)
    assert m["recall@10"] == 0.5
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert m["mrr@10"] == 0.5


def test_perfect_ranking_is_one_and_mean_over_queries():
    out = metrics.ranking_metrics([["a", "b"], ["c", "a"]], [{"a"}, {"a"}], k=10)
    assert out["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert out["recall@10"] == 1.0
    assert out["mrr@10"] == pytest.approx(0.75)
    assert out["num_queries"] == 2


def test_group_queries_merges_lines_that_share_a_query():
    rows = [
        {"query": "q1", "doc_id": "a"},
        {"query": "q2", "doc_id": "b"},
        {"query": "q1", "doc_id": "c"},
    ]
    queries, relevant = metrics.group_queries(rows)
    assert queries == ["q1", "q2"] and relevant == [{"a", "c"}, {"b"}]


def test_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        metrics.query_metrics(["a"], {"a"}, k=0)
    with pytest.raises(ValueError, match="no queries"):
        metrics.ranking_metrics([], [])
    with pytest.raises(ValueError, match="relevance sets"):
        metrics.ranking_metrics([["a"]], [])


def test_per_query_values_average_to_the_means():
    out = ranking_metrics(
        [["a", "b"], ["c"], ["x", "y"]], [{"a"}, {"b"}, {"y"}], k=10, per_query=True
    )
    for name, values in out["per_query"].items():
        assert sum(values) / 3 == pytest.approx(out[name])
    assert out["per_query"]["mrr@10"] == [1.0, 0.0, 0.5]


def test_bootstrap_interval_brackets_the_mean_and_pairs_the_samples():
    rng = np.random.default_rng(1)
    a = rng.random(200)
    lo, hi = bootstrap_interval(lambda m: m, a)
    assert lo < a.mean() < hi and hi - lo < 0.2
    assert bootstrap_interval(lambda m: m, np.full(50, 0.3)) == pytest.approx((0.3, 0.3))
    # paired: the difference of a sample with itself is 0 in every replicate
    assert bootstrap_interval(lambda x, y: x - y, a, a) == (0.0, 0.0)
    assert bootstrap_interval(lambda m: m, a, seed=3) == bootstrap_interval(lambda m: m, a, seed=3)
    with pytest.raises(ValueError, match="one value per query"):
        bootstrap_interval(lambda x, y: x - y, a, a[:10])


def test_validation_split_halves_the_queries_disjointly_and_is_fixed():
    val, test = validation_split(371)
    assert len(val) == 185 and len(test) == 186
    assert sorted(val + test) == list(range(371))
    assert val == sorted(val) and test == sorted(test)
    assert validation_split(371) == (val, test)
    assert validation_split(371, seed=2) != (val, test)
    with pytest.raises(ValueError, match=">= 2 queries"):
        validation_split(1)

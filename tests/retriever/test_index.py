"""Searchers against the numpy exact oracle: scores, recall, serialisation, input checks."""

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from retriever import index

DIM = 64


def clustered(n: int, num_queries: int, *, dim: int = DIM, seed: int = 0):
    """Unit vectors from 50 Gaussian clusters; queries near random corpus rows."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((50, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    corpus = centres[rng.integers(0, 50, n)] + 0.7 / np.sqrt(dim) * rng.standard_normal((n, dim))
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    queries = corpus[rng.integers(0, n, num_queries)]
    queries = queries + 0.5 / np.sqrt(dim) * rng.standard_normal((num_queries, dim))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return corpus.astype(np.float32), queries.astype(np.float32)


def true_scores(corpus, queries, ids):
    return np.einsum("qd,qkd->qk", queries, corpus[ids])


def recall(found, truth):
    return np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)])


@pytest.fixture(scope="module")
def data():
    return clustered(20_000, 200)


@pytest.fixture(scope="module")
def oracle(data):
    corpus, queries = data
    return index.ExactSearcher(corpus).search(queries, 10)


@pytest.fixture(scope="module")
def tree_searcher(data):
    return index.ScannSearcher.build(data[0], kind="scann")


def test_exact_matches_full_sort():
    corpus, queries = clustered(3_000, 20)
    full = np.sort(queries @ corpus.T, axis=1)[:, ::-1][:, :10]
    scores, ids = index.ExactSearcher(corpus).search(queries, 10)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    assert_allclose(scores, full, atol=1e-6)
    assert_allclose(true_scores(corpus, queries, ids), scores, atol=1e-6)


def test_exact_ties_at_the_kth_score():
    corpus, queries = clustered(1_000, 20)
    corpus = np.concatenate([corpus, corpus[:500]])  # duplicate rows: tied scores everywhere
    full = np.sort(queries @ corpus.T, axis=1)[:, ::-1]
    for k in (1, 2, 3, 10):
        scores, ids = index.ExactSearcher(corpus).search(queries, k)
        assert_allclose(scores, full[:, :k], atol=1e-6)
        assert_allclose(true_scores(corpus, queries, ids), scores, atol=1e-6)
        assert np.all([len(set(row)) == k for row in ids])


def test_exact_blocks_do_not_change_results(data, oracle):
    corpus, queries = data
    small_blocks = index.ExactSearcher(corpus, block_elements=7 * len(corpus))
    assert small_blocks.block_size == 7
    scores, _ = small_blocks.search(queries, 10)
    assert_allclose(scores, oracle[0], atol=1e-6)


def test_exact_k_above_size_is_clamped():
    corpus, queries = clustered(12, 3)
    scores, ids = index.ExactSearcher(corpus).search(queries, 50)
    assert scores.shape == ids.shape == (3, 12)
    assert_array_equal(np.sort(ids, axis=1), np.tile(np.arange(12), (3, 1)))
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_scann_brute_force_matches_exact(data, oracle):
    corpus, queries = data
    scores, ids = index.ScannSearcher.build(corpus, kind="scann-bf").search(queries, 10)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    assert_allclose(scores, oracle[0], atol=1e-5)
    assert_allclose(true_scores(corpus, queries, ids), scores, atol=1e-5)


def test_scann_tree_ah_recall_and_reordered_scores(data, oracle, tree_searcher):
    corpus, queries = data
    assert tree_searcher.params == index.ScannParams.for_corpus(len(corpus))
    assert tree_searcher.params.num_leaves > 0
    scores, ids = tree_searcher.search(queries, 10)
    assert recall(ids, oracle[1]) >= 0.9
    # Float32 reordering: the returned scores are the true inner products of the returned ids.
    assert_allclose(true_scores(corpus, queries, ids), scores, atol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_scann_ah_without_tree_recall():
    corpus, queries = clustered(5_000, 100, seed=1)
    searcher = index.ScannSearcher.build(corpus, kind="scann")
    assert searcher.params.num_leaves == 0 and searcher.params.use_ah
    scores, ids = searcher.search(queries, 10)
    truth_scores, truth_ids = index.ExactSearcher(corpus).search(queries, 10)
    assert recall(ids, truth_ids) >= 0.9
    assert_allclose(true_scores(corpus, queries, ids), scores, atol=1e-5)


def test_scann_small_corpus_is_brute_force_and_clamps_k():
    corpus, queries = clustered(300, 10, seed=2)
    searcher = index.ScannSearcher.build(corpus, kind="scann")
    assert not searcher.params.use_ah
    scores, _ = searcher.search(queries, 1_000)
    assert scores.shape == (10, 300)
    assert_allclose(scores, index.ExactSearcher(corpus).search(queries, 1_000)[0], atol=1e-5)


def test_scann_tree_pads_missing_neighbours(data, tree_searcher):
    corpus, queries = data
    scores, ids = tree_searcher.search(queries[:5], len(corpus))
    assert scores.shape == (5, len(corpus))
    missing = ids == -1
    assert missing.any() and np.all(scores[missing] == -np.inf)
    assert np.all(np.diff(missing.astype(int), axis=1) >= 0)  # padding only in the tail
    found = ~missing
    got = true_scores(corpus, queries[:5], np.where(found, ids, 0))[found]
    assert_allclose(got, scores[found], atol=1e-5)


@pytest.mark.parametrize("kind", ["exact", "scann-bf", "scann"])
def test_save_load_round_trip(kind, data, tree_searcher, tmp_path):
    corpus, queries = data
    searcher = tree_searcher if kind == "scann" else index.build_searcher(corpus, kind)
    searcher.save(tmp_path / "index")
    loaded = index.load_searcher(tmp_path / "index")
    assert isinstance(loaded, index.Searcher)
    assert (loaded.kind, loaded.size, loaded.dim) == (kind, len(corpus), DIM)
    assert getattr(loaded, "params", None) == getattr(searcher, "params", None)
    for got, want in zip(loaded.search(queries, 10), searcher.search(queries, 10)):
        assert_array_equal(got, want)


def test_build_searcher_auto(data, monkeypatch):
    corpus, _ = data
    assert index.build_searcher(corpus).kind == "exact"
    monkeypatch.setattr(index, "AUTO_EXACT_MAX", 1_000)
    assert index.build_searcher(corpus[:5_000]).kind == "scann"


def test_derived_params():
    assert not index.ScannParams.for_corpus(999).use_ah
    assert index.ScannParams.for_corpus(9_999).num_leaves == 0
    big = index.ScannParams.for_corpus(1_000_000)
    assert (big.num_leaves, big.num_leaves_to_search, big.training_sample_size) == (
        1_000,
        100,
        250_000,
    )
    assert index.ScannParams.for_corpus(10_000).num_leaves_to_search == 20
    assert index.ScannParams.for_corpus(10**9).num_leaves == 4_000


@pytest.mark.parametrize(
    "corpus, match",
    [
        (np.zeros(8, np.float32), "2-D"),
        (np.zeros((4, 8), np.int32), "float"),
        (np.zeros((0, 8), np.float32), "empty"),
        (np.zeros((4, 0), np.float32), "column"),
    ],
)
@pytest.mark.parametrize("kind", ["exact", "scann-bf", "scann"])
def test_bad_corpus(corpus, match, kind):
    with pytest.raises(ValueError, match=match):
        index.build_searcher(corpus, kind)


@pytest.mark.parametrize(
    "queries, k, match",
    [
        (np.zeros((2, DIM + 1), np.float32), 3, "dimension"),
        (np.zeros(DIM, np.float32), 3, "2-D"),
        (np.zeros((2, DIM), np.float32), 0, "k must"),
        (np.zeros((2, DIM), np.float32), 2.0, "k must"),
    ],
)
@pytest.mark.parametrize("kind", ["exact", "scann-bf"])
def test_bad_queries(queries, k, match, kind):
    corpus, _ = clustered(50, 1)
    with pytest.raises(ValueError, match=match):
        index.build_searcher(corpus, kind).search(queries, k)


def test_bad_kind_params_and_directory(tmp_path):
    corpus, _ = clustered(50, 1)
    with pytest.raises(ValueError, match="kind"):
        index.build_searcher(corpus, "faiss")
    with pytest.raises(ValueError, match="num_leaves_to_search"):
        index.ScannParams(num_leaves=10, num_leaves_to_search=11)
    with pytest.raises(ValueError, match="params"):
        index.ScannSearcher.build(corpus, kind="scann-bf", params=index.ScannParams())
    with pytest.raises(FileNotFoundError, match="searcher.json"):
        index.load_searcher(tmp_path)

"""`retriever.lexical.BM25` against the textbook formula computed word by word."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from retriever.lexical import BM25, words


def _reference(texts, query, k1=1.2, b=0.75):
    docs = [words(t) for t in texts]
    mean = sum(map(len, docs)) / len(docs)
    out = []
    for doc in docs:
        tf, score = Counter(doc), 0.0
        for word in set(words(query)):
            df = sum(word in d for d in docs)
            if tf[word]:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                score += idf * tf[word] * (k1 + 1) / (tf[word] + k1 * (1 - b + b * len(doc) / mean))
        out.append(score)
    return np.array(out)


def test_scores_match_the_formula_on_a_random_corpus():
    rng = np.random.default_rng(0)
    vocabulary = [f"w{i}" for i in range(30)]
    texts = [" ".join(rng.choice(vocabulary, rng.integers(1, 12))) for _ in range(40)]
    for b in (0.0, 0.75, 1.0):
        index = BM25(texts, b=b)
        for _ in range(10):
            query = " ".join(rng.choice(vocabulary, 3)) + " unseen"
            np.testing.assert_allclose(index.scores(query), _reference(texts, query, b=b))


def test_search_ranks_best_first_and_breaks_ties_by_order():
    texts = ["Diagnosis: Madox. Symptoms: Tadrunic", "madox madox", "tadrunic gugolal", "x y"]
    scores, ids = BM25(texts).search(["Which disease causes tadrunic numbness and gugolal?"], 9)
    assert ids.shape == (1, 4) and ids[0, 0] == 2  # both rare words; k clipped to 4
    assert list(scores[0]) == sorted(scores[0], reverse=True)
    _, tied = BM25(["a b", "a b", "c"]).search(["b"], 2)
    assert list(tied[0]) == [0, 1]
    assert not BM25(texts).scores("nothing here matches").any()


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        BM25(["a"], b=2.0)
    with pytest.raises(ValueError):
        BM25(["a"]).search(["a"], 0)


def test_overlap_scores_are_the_weighted_share_of_the_questions_words():
    from retriever.lexical import OverlapEncoder

    texts = ["Diagnosis: Madox. Tadrunic numbness", "numbness spots", "nothing shared"]
    encoder = OverlapEncoder(texts, weight=len)  # a word's weight: its length
    q = "Which disease causes tadrunic numbness and gugolal spots?"
    scores = encoder.documents() @ encoder.encode([q])[0]
    total = len("tadrunic") + len("numbness") + len("gugolal") + len("spots")
    expected = [(len("tadrunic") + len("numbness")) / total, (8 + 5) / total, 0.0]
    np.testing.assert_allclose(scores, expected, atol=4 / 2**20)  # shares on a 2^-20 grid
    assert not encoder.encode(["Which disease causes it?"]).any()  # no content word


def test_an_overlap_score_depends_on_its_own_document_only():
    from retriever.lexical import OverlapEncoder

    texts = ["tadrunic numbness", "gugolal spots", "numbness"]
    q = "tadrunic numbness or gugolal spots"
    alone = OverlapEncoder(texts)
    more = OverlapEncoder(texts + ["tadrunic gugolal spots numbness zeta"])
    a = alone.documents() @ alone.encode([q])[0]
    b = (more.documents() @ more.encode([q])[0])[:3]
    np.testing.assert_array_equal(a, b)


def test_an_overlap_score_is_bit_identical_whatever_the_other_documents():
    """The sum's order follows the vocabulary numbering, which the other documents set:
    with float shares 18/24 came out as 0.75 or 0.7499999 (a tau of 0.75 then decides
    differently); dyadic shares make every order exact."""
    from retriever.lexical import OverlapEncoder

    weight = {"aa": 5, "bb": 6, "cc": 7, "dd": 6}.get
    q = "aa bb cc dd"
    target = "aa bb cc"
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        others = list(rng.permutation(["dd", "cc", "bb", "aa", "zz", "aa zz", "cc dd"]))
        others = others[: int(rng.integers(0, len(others) + 1))]
        texts = [*others, target]
        encoder = OverlapEncoder(texts, weight=lambda w: weight(w, 1))
        scores = encoder.documents() @ encoder.encode([q])[0]
        seen.add(float(scores[-1]))
    assert len(seen) == 1 and abs(seen.pop() - 0.75) < 1e-5


# ---- hashed fixed-width overlap vectors ---------------------------------------------------


def _overlap_oracle(texts, question, weight):
    """Plain Python: the share of the question's content words (each weight over the
    total, rounded down to a multiple of 2^-20) that each document holds."""
    from retriever.lexical import GRID, QUESTION_WORDS

    content = {w for w in words(question) if w not in QUESTION_WORDS}
    total = sum(weight(w) for w in content)
    share = {w: math.floor(weight(w) / total * GRID) / GRID for w in content}
    return np.array([sum(share[w] for w in content if w in set(words(t))) for t in texts])


def _fixture(seed, documents=30):
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}x" for i in range(40)]
    texts = [" ".join(rng.choice(vocabulary, rng.integers(1, 10))) for _ in range(documents)]
    questions = [" ".join(rng.choice(vocabulary, rng.integers(1, 6))) for _ in range(8)]
    return vocabulary, texts, questions


def test_overlap_vectors_have_the_public_width_whatever_the_collection():
    """The width is a public constant, not the collection's vocabulary size (a private
    quantity that the old dense vectors' shape released)."""
    from scipy import sparse

    from retriever.lexical import WIDTH, OverlapEncoder

    small = OverlapEncoder(["tadrunic numbness"])
    large = OverlapEncoder([f"word{i} other{i} numbness" for i in range(50)])
    assert small.documents().shape == (1, WIDTH) and large.documents().shape == (50, WIDTH)
    for encoder in (small, large):
        assert encoder.encode(["tadrunic numbness?", "gugolal"]).shape == (2, WIDTH)
        assert sparse.issparse(encoder.documents())  # 1M records: never a dense matrix


def test_a_word_hashes_to_the_same_bucket_in_every_process():
    """BLAKE2b, not Python's per-process salted `hash` (golden values)."""
    from retriever.lexical import bucket

    assert (bucket("tadrunic"), bucket("gugolal"), bucket("tadrunic", 8)) == (642847, 363640, 7)


def test_hashed_overlap_scores_equal_the_exact_overlap_without_collisions():
    from retriever.lexical import OverlapEncoder, bucket

    weight = {f"w{i}x": 1 + i % 7 for i in range(40)}.__getitem__
    for seed in range(3):
        vocabulary, texts, questions = _fixture(seed)
        assert len({bucket(w) for w in vocabulary}) == len(vocabulary)  # no collision here
        encoder = OverlapEncoder(texts, weight=weight)
        documents = encoder.documents()
        np.testing.assert_array_equal(documents.data, 1.0)  # a repeated word marked once
        for question in questions:
            scores = documents @ encoder.encode([question])[0]
            assert isinstance(scores, np.ndarray) and scores.dtype == np.float32
            np.testing.assert_allclose(scores, _overlap_oracle(texts, question, weight))


def test_a_hashed_overlap_score_is_bit_identical_whatever_the_other_documents():
    from retriever.lexical import OverlapEncoder

    weight = {f"w{i}x": 1 + i % 7 for i in range(40)}.__getitem__
    _, texts, questions = _fixture(0)
    _, others, _ = _fixture(1, documents=12)
    alone = OverlapEncoder(texts, weight=weight)
    for question in questions:
        target = alone.documents() @ alone.encode([question])[0]
        for extra in (others, others[:3], []):
            more = OverlapEncoder([*extra, *texts[:-1], "w3x w5x"], weight=weight)
            scores = more.documents() @ more.encode([question])[0]
            np.testing.assert_array_equal(scores[len(extra) : -1], target[:-1])
        fewer = OverlapEncoder(texts[1:], weight=weight)
        np.testing.assert_array_equal(fewer.documents() @ fewer.encode([question])[0], target[1:])


def test_collisions_only_add_and_keep_every_score_within_zero_and_one():
    """A narrow width forces collisions: a document marks a bucket once, a question's
    bucket sums its words' shares, so a score lies between the exact overlap and 1."""
    from retriever.lexical import OverlapEncoder

    weight = {f"w{i}x": 1 + i % 7 for i in range(40)}.__getitem__
    _, texts, questions = _fixture(2)
    for width in (1, 3, 16):
        encoder = OverlapEncoder(texts, weight=weight, width=width)
        assert encoder.documents().shape == (len(texts), width)
        np.testing.assert_array_equal(encoder.documents().data, 1.0)
        for question in questions:
            scores = encoder.documents() @ encoder.encode([question])[0]
            assert np.all(scores >= _overlap_oracle(texts, question, weight))
            assert np.all(scores <= 1.0)
            if width == 1:  # one bucket: every (non-empty) document gets every share
                np.testing.assert_array_equal(scores, encoder.encode([question]).sum())


def test_dprag_keeps_the_overlap_matrix_sparse_and_scores_with_it():
    from scipy import sparse

    from retriever.lexical import OverlapEncoder
    from retriever.rag import DPRag
    from synthgen.lm_backends import TinyLM

    weight = {f"w{i}x": 1 + i % 7 for i in range(40)}.__getitem__
    _, texts, questions = _fixture(0)
    encoder = OverlapEncoder(texts, weight=weight)
    ids = [f"d{i}" for i in range(len(texts))]
    rag = DPRag(ids, texts, encoder.documents(), encoder.encode, TinyLM())
    assert sparse.issparse(rag.embeddings)
    scores = rag._scores(questions[0])
    assert isinstance(scores, np.ndarray) and scores.shape == (len(texts),)
    np.testing.assert_allclose(scores, _overlap_oracle(texts, questions[0], weight))
    bad = encoder.documents().copy()
    bad.data[0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        DPRag(ids, texts, bad, encoder.encode, TinyLM())
    with pytest.raises(ValueError, match="one embedding row"):
        DPRag(ids[:-1], texts[:-1], encoder.documents(), encoder.encode, TinyLM())

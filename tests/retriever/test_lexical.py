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

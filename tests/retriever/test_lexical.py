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

"""The default answer settings: facts (keywords at the same event as its fallback), icl where
only it fits."""

import pytest

from retriever.rag.defaults import EVALUATED_K, resolve


def test_resolve_fills_auto_and_k_and_refuses_the_rest():
    for epsilon in (1.0, 5.0, 10.0, 50.0):  # facts at every epsilon, on both retrievals
        assert resolve("auto", None, epsilon) == ("facts", EVALUATED_K["keywords"])
        assert resolve("auto", None, epsilon, retrieval="overlap")[0] == "facts"
    # per-document filters take a zCDP curve: icl whatever the retrieval
    assert resolve("auto", None, 5.0, retrieval="overlap", accounting="individual")[0] == "icl"
    assert resolve("keywords", None, 5.0) == ("keywords", EVALUATED_K["keywords"])
    # keywords (facts' fallback) was measured with 64 voters: with 4 it could never
    # release; auto takes icl
    assert resolve("auto", 4, 5.0, retrieval="overlap") == ("icl", 4)
    assert resolve("auto", 64, 5.0, retrieval="overlap") == ("facts", 64)
    assert resolve("icl", 7, 5.0) == ("icl", 7)
    with pytest.raises(ValueError, match="mechanism"):
        resolve("best", None, 5.0)
    for retired in ("vote", "sparse-vote", "answer-vote"):
        with pytest.raises(ValueError, match=f"the {retired} mechanism was retired.*use facts"):
            resolve(retired, None, 5.0)
    assert set(EVALUATED_K) == {"icl", "keywords", "facts"}
    with pytest.raises(ValueError, match="k must be"):
        resolve("icl", 0, 5.0)
    with pytest.raises(ValueError, match="accounting"):
        resolve("auto", None, 5.0, accounting="per-tenant")
    with pytest.raises(ValueError, match="epsilon"):
        resolve("auto", None, 0.0)
    with pytest.raises(ValueError, match="retrieval"):
        resolve("auto", None, 1.0, retrieval="bm25")


def test_the_relevance_threshold_defaults_to_the_calibrated_tau_of_the_retrieval():
    from retriever.rag.defaults import CALIBRATED_RELEVANCE, relevance_threshold

    assert relevance_threshold(None) == CALIBRATED_RELEVANCE["dense"] == 0.6
    assert relevance_threshold(None, "overlap") == CALIBRATED_RELEVANCE["overlap"] == 0.75
    assert relevance_threshold(0.4, "overlap") == 0.4
    with pytest.raises(ValueError, match="retrieval"):
        relevance_threshold(None, "bm25")

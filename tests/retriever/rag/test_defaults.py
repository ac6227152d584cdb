"""The default answer settings are the DP-RAG evaluation's winners, by retrieval and epsilon."""

import json
from pathlib import Path

import pytest

from retriever.rag.defaults import EVALUATED, EVALUATED_K, best_mechanism, resolve

DOCS = Path(__file__).parents[3] / "docs"
EVALUATIONS = {
    "dense": [DOCS / "dp_rag_eval.json", DOCS / "dp_rag_dense_keywords.json"],
    "overlap": [DOCS / "dp_rag_overlap.json"],
}


@pytest.mark.parametrize("retrieval", sorted(EVALUATED))
def test_best_mechanism_uses_the_largest_evaluated_epsilon_not_above(retrieval):
    table = EVALUATED[retrieval]
    assert best_mechanism(10.0, retrieval) == table[10.0]
    assert best_mechanism(50.0, retrieval) == table[10.0]
    assert best_mechanism(4.0, retrieval) == table[3.0]
    assert best_mechanism(0.1, retrieval) == table[1.0]
    with pytest.raises(ValueError):
        best_mechanism(0.0, retrieval)
    with pytest.raises(ValueError, match="retrieval"):
        best_mechanism(1.0, "bm25")


def test_resolve_fills_auto_and_k_and_refuses_the_rest():
    dense = EVALUATED["dense"][5.0]
    assert resolve("auto", None, 5.0) == (dense, EVALUATED_K[dense])
    assert resolve("auto", None, 5.0, retrieval="overlap") == ("keywords", EVALUATED_K["keywords"])
    # per-document filters take a zCDP curve: icl whatever the retrieval
    assert resolve("auto", None, 5.0, retrieval="overlap", accounting="individual")[0] == "icl"
    assert resolve("vote", None, 5.0) == ("vote", EVALUATED_K["vote"])
    # keywords was measured with 64 voters: with 4 it could never release; auto takes icl
    assert resolve("auto", None, 5.0, retrieval="overlap")[0] == "keywords"
    assert resolve("auto", 4, 5.0, retrieval="overlap") == ("icl", 4)
    assert resolve("auto", 64, 5.0, retrieval="overlap") == ("keywords", 64)
    assert resolve("icl", 7, 5.0) == ("icl", 7)
    with pytest.raises(ValueError, match="mechanism"):
        resolve("best", None, 5.0)
    with pytest.raises(ValueError, match="k must be"):
        resolve("icl", 0, 5.0)
    with pytest.raises(ValueError, match="accounting"):
        resolve("auto", None, 5.0, accounting="per-tenant")


@pytest.mark.parametrize("retrieval", sorted(EVALUATED))
def test_the_defaults_are_the_recorded_evaluation_winners(retrieval):
    """Each evaluated epsilon's default is the cell with the best accuracy in the committed
    evaluation of that retrieval (ties: more abstentions, i.e. fewer wrong answers shown),
    at its k."""
    table = {
        row["cell"]: row
        for path in EVALUATIONS[retrieval]
        for row in json.loads(path.read_text())["table"]
    }
    evaluated = [m for m in EVALUATED_K if f"{m}-eps10" in table]
    assert "icl" in evaluated and len(evaluated) >= 2
    for mechanism in evaluated:
        assert table[f"{mechanism}-eps10"]["k"] == EVALUATED_K[mechanism]
    for epsilon, chosen in EVALUATED[retrieval].items():
        cells = [
            (table[cell]["accuracy"], table[cell]["abstained"], mechanism)
            for mechanism in evaluated
            if (cell := f"{mechanism}-eps{epsilon:g}") in table  # evaluated there
        ]
        assert max(cells)[2] == chosen, epsilon


def test_the_relevance_threshold_defaults_to_the_calibrated_tau_of_the_retrieval():
    from retriever.rag.defaults import CALIBRATED_RELEVANCE, relevance_threshold

    assert relevance_threshold(None) == CALIBRATED_RELEVANCE["dense"] == 0.6
    assert relevance_threshold(None, "overlap") == CALIBRATED_RELEVANCE["overlap"] == 0.75
    assert relevance_threshold(0.4, "overlap") == 0.4
    with pytest.raises(ValueError, match="retrieval"):
        relevance_threshold(None, "bm25")

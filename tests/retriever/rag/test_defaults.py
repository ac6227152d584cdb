"""The default answer settings are the DP-RAG evaluation's winners, by epsilon."""

import json
from pathlib import Path

import pytest

from retriever.rag.defaults import EVALUATED, EVALUATED_K, best_mechanism, resolve

EVAL = Path(__file__).parents[3] / "docs" / "dp_rag_eval.json"


def test_best_mechanism_uses_the_largest_evaluated_epsilon_not_above():
    assert best_mechanism(10.0) == EVALUATED[10.0]
    assert best_mechanism(50.0) == EVALUATED[10.0]
    assert best_mechanism(4.0) == EVALUATED[3.0]
    assert best_mechanism(0.1) == EVALUATED[1.0]
    with pytest.raises(ValueError):
        best_mechanism(0.0)


def test_resolve_fills_auto_and_k_and_refuses_the_rest():
    assert resolve("auto", None, 5.0) == (EVALUATED[5.0], EVALUATED_K[EVALUATED[5.0]])
    assert resolve("vote", None, 5.0) == ("vote", EVALUATED_K["vote"])
    assert resolve("icl", 7, 5.0) == ("icl", 7)
    with pytest.raises(ValueError, match="mechanism"):
        resolve("best", None, 5.0)
    with pytest.raises(ValueError, match="k must be"):
        resolve("icl", 0, 5.0)


def test_the_defaults_are_the_recorded_evaluation_winners():
    """Each evaluated epsilon's default is the cell with the best accuracy in the committed
    evaluation (ties: more abstentions, i.e. fewer wrong answers shown), at its k."""
    table = {row["cell"]: row for row in json.loads(EVAL.read_text())["table"]}
    evaluated = [m for m in EVALUATED_K if f"{m}-eps10" in table]
    assert {"icl", "vote", "sparse-vote"} <= set(evaluated)
    for mechanism in evaluated:
        assert table[f"{mechanism}-eps10"]["k"] == EVALUATED_K[mechanism]
    for epsilon, chosen in EVALUATED.items():
        cells = [
            (table[f"{mechanism}-eps{epsilon:g}"]["accuracy"],
             table[f"{mechanism}-eps{epsilon:g}"]["abstained"], mechanism)
            for mechanism in evaluated
        ]  # fmt: skip
        assert max(cells)[2] == chosen, epsilon

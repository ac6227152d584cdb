"""Auditing a fact release of one's own collection: a planted leak is caught, DP is not."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from retriever.rag.fact_world import make_world, write_world
from synthgen.audit.fact_release import audit_fact_release, canary_scores, make_canaries
from synthgen.knowledge.facts import FactConfig
from synthgen.knowledge.phrases import pair_key, record_pairs
from tests.retriever.service.harness import cli


def _leaky(texts, config):
    """Every pair any record states with its true count: no DP at all."""
    counts = Counter(p for t in texts for p in record_pairs(t, config.max_pairs))
    return {k: float(v) for k, v in counts.items()}


@pytest.fixture(scope="module")
def world():
    return make_world("people", facts_per_level=2, seed=3)


def test_a_planted_leak_is_detected_above_its_claim(world):
    result = audit_fact_release(
        world.documents, FactConfig(epsilon=1.0), canaries=300, seed=0, release=_leaky
    )
    assert result.included_released == result.included and result.excluded_released == 0
    assert result.epsilon_lower_bound > 1.0 and result.leak and result.verdict == "leak"


def test_a_leak_under_a_claim_no_bound_can_reach_is_caught_by_the_card_check(world):
    result = audit_fact_release(
        world.documents, FactConfig(epsilon=10.0), canaries=300, seed=0, release=_leaky
    )
    assert result.epsilon_cap <= 10.0 and result.epsilon_lower_bound <= 10.0
    assert result.card_check_p < 1e-6 and result.verdict == "leak"


def test_the_dp_release_stays_under_its_claim(world):
    result = audit_fact_release(world.documents, FactConfig(epsilon=3.0), canaries=300, seed=0)
    assert result.epsilon_lower_bound <= 3.0 and not result.leak
    assert result.canaries == 300 and 0 < result.included < 300
    assert result.verdict == ("no leak found" if result.epsilon_cap > 3.0 else "inconclusive")
    high = audit_fact_release(world.documents, FactConfig(epsilon=10.0), canaries=300, seed=0)
    assert high.epsilon_cap <= 10.0 and high.verdict == "inconclusive"


def test_canaries_are_unique_and_scored_by_what_was_released():
    import numpy as np

    canaries = make_canaries(8, np.random.default_rng(0), set())
    assert len(set(canaries)) == 8
    first = record_pairs(canaries[0], 1)[0]
    scores = canary_scores(canaries, {first: 7.5, pair_key("Ada Vorn", "Tarnwick"): 40.0})
    assert scores[0] == 7.5 and not scores[1:].any()
    with pytest.raises(ValueError, match="10 canaries"):
        audit_fact_release(["x"], FactConfig(epsilon=1.0), canaries=5)


def test_the_command_prints_the_bound_against_the_claim(world, tmp_path):
    write_world(world, tmp_path)
    result = cli("knowledge", "audit", "--private-corpus", tmp_path / "corpus.jsonl",
                 "--epsilon", 10, "--canaries", 100, "--seed", 1, "--json")  # fmt: skip
    line = json.loads(result.stdout)
    assert line["claimed_epsilon"] == 10 and not line["leak"] and "seconds" not in line
    assert line["verdict"] == "inconclusive"  # 100 canaries cannot bound near 10
    assert line["epsilon_lower_bound"] <= 10 and line["canaries"] == 100

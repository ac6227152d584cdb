"""The operator's preview of a fact release (`synthgen.knowledge.preview`): the release's own
extractor and K, exact counts (not DP), and what a release at epsilon would carry."""

import json

import pytest

from dpsynth.evaluation.natural_world import make_natural_world
from synthgen.knowledge.facts import FactConfig, plan_facts
from synthgen.knowledge.preview import preview_facts
from synthgen.knowledge.typed_facts import fact_key
from tests.dpsynth.service.harness import cli


def test_the_preview_counts_what_the_release_reads():
    texts = ["Team Heron owns the payments gateway."] * 12 + ["The mail relay runs v2.1.0."] * 3
    texts += ["Ticket #1\nSubject: hello\nOpened: 2026-01-02 10:00\n\nThanks,\nDana"] * 5
    found = preview_facts(texts, FactConfig(epsilon=10.0))
    assert found.records == 20 and found.records_with_facts == 15
    assert found.facts == [
        (fact_key("the payments gateway", "Team Heron"), 12),
        (fact_key("The mail relay", "v2.1.0"), 3),
    ]
    assert found.kinds == {"team": 1, "version": 1}
    plan = plan_facts(FactConfig(epsilon=10.0), 20)
    assert found.expected_released == pytest.approx(
        plan.keep_probability(12) + plan.keep_probability(3)
    )
    assert found.likely_released == 1 and found.records_needed == plan.records_needed(0.5)
    # the phrase extractor reads the header words and the timestamp as facts
    phrases = preview_facts(texts, FactConfig(epsilon=10.0, extractor="phrases"))
    assert any("2026" in key for key, _ in phrases.facts)
    with pytest.raises(ValueError, match="no record"):
        preview_facts([], FactConfig(epsilon=1.0))


def test_the_preview_command_says_it_is_not_dp(tmp_path):
    world = make_natural_world("helpdesk", facts_per_level=1, seed=4)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"doc_id": str(i), "text": t}) + "\n" for i, t in enumerate(world.documents)
        )  # fmt: skip
    )
    shown = cli("knowledge", "preview", "--private-corpus", corpus, "--json", "--top", 5)
    assert "NOT DP" in shown.stderr and "nothing is charged" in shown.stderr
    row = json.loads(shown.stdout)
    assert row["records"] == len(world.documents) and len(row["top_facts"]) == 5
    assert row["records_with_facts"] > row["records"] // 2 and row["likely_released"] >= 1

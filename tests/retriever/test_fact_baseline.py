"""The non-private baseline: retrieval's ceiling and the typed reader on exact counts."""

import pytest

from dpsynth.evaluation.natural_world import make_natural_world
from retriever.fact_baseline import fact_baseline, states


def test_states_matches_whole_values_only():
    assert states("Team Heron owns it", "team heron")
    assert not states("kept for 45", "45 days")
    assert not states("10.40.2.17", "10.40")
    assert not states("anything", "")


def test_the_baseline_answers_what_the_records_state_and_abstains_on_the_rest():
    texts = ["Team Heron owns the payments gateway."] * 3 + ["Lunch is at noon."] * 5
    base = fact_baseline(
        texts,
        ["Which team owns the payments gateway?", "Which team owns the billing service?"],
        ["Team Heron", None],
        k=2,
    )
    first, second = base.rows
    assert first.typed_answer == "Team Heron" and first.typed_right and first.retrieval_hit
    assert second.typed_answer is None and second.typed_right is None
    summary = base.summary()
    assert summary["typed_right"] == 1.0 and summary["retrieval_top2_holds_answer"] == 1.0
    assert summary["with_expected_answers"] == 1 and "not_dp" in summary


def test_on_a_natural_world_exact_counts_answer_the_facts_many_tickets_state():
    """Without noise the typed reader answers most facts stated in 20+ tickets of the
    helpdesk validation world; a release can only do worse (its counts are noisy and
    thresholded)."""
    world = make_natural_world("helpdesk", seed=0)
    asked = [q for q in world.questions if q.support >= 20]
    base = fact_baseline(world.documents, [q.question for q in asked], [q.answer for q in asked])
    assert base.summary()["typed_right"] >= 0.8


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="records"):
        fact_baseline([], ["q?"])
    with pytest.raises(ValueError, match="expected"):
        fact_baseline(["a"], ["q?"], ["x", "y"])
    with pytest.raises(ValueError, match="k and max_pairs"):
        fact_baseline(["a"], ["q?"], k=0)


def test_the_cli_prints_the_ceilings_and_warns_it_is_not_dp(tmp_path):
    import json
    import sys

    import cli_process

    from dpsynth.evaluation.fact_world import write_world

    write_world(make_natural_world("facilities", seed=1), tmp_path)
    done = cli_process.run(
        [sys.executable, "-m", "dpsynth.cli.retriever", "knowledge", "baseline", "--private-corpus",
         str(tmp_path / "corpus.jsonl"), "--questions", str(tmp_path / "questions.jsonl"),
         "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "NOT DP" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["with_expected_answers"] > 0 and 0 <= summary["typed_right"] <= 1

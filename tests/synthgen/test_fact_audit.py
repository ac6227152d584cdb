"""Auditing a fact release of one's own collection: a planted leak is caught, DP is not."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from dpsynth.evaluation.fact_world import make_world, write_world
from synthgen.audit.fact_release import (
    audit_fact_release,
    canary_scores,
    make_canaries,
    make_over_k_canaries,
)
from synthgen.knowledge import facts
from synthgen.knowledge.facts import FactConfig
from synthgen.knowledge.phrases import pair_key, record_pairs, record_phrases
from synthgen.knowledge.typed_facts import record_fact_keys, statements
from synthgen.privacy.partition_selection import release_key_counts
from tests.dpsynth.service.harness import cli


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


def _each_statement(text, max_pairs):
    """A broken dedupe: each of a record's first K pairs once per sentence stating it."""
    sentences = [{pair_key(a, b) for a in s for b in s if a != b} for s in record_phrases(text)]
    return [
        p
        for p in record_pairs(text, max_pairs)
        for _ in range(max(1, sum(p in s for s in sentences)))
    ]


def _each_repeat_counted(unit_keys, **kwargs):
    """The selection with a unit's repeated key counted once per repeat."""
    units = []
    for keys in unit_keys:
        counts = Counter(keys)
        units += [
            [k for k in counts if counts[k] > j] for j in range(max(counts.values(), default=0))
        ]
    return release_key_counts(units, **kwargs)


def _every_pair(text, max_pairs):
    """A broken K cap: every pair of the record."""
    return record_pairs(text, 10**6)


def _each_statement_typed(text, max_facts):
    """A broken dedupe of the typed extractor: each fact once per sentence stating it."""
    sentences = [set(record_fact_keys(s, 10**6)) for s, _ in statements(text)]
    return [
        k
        for k in record_fact_keys(text, max_facts)
        for _ in range(max(1, sum(k in s for s in sentences)))
    ]


def _every_fact_typed(text, max_facts):
    """A broken K cap of the typed extractor: every fact of the record."""
    return record_fact_keys(text, 10**6)


def _k_at_a_time(unit_keys, *, max_keys, **kwargs):
    """The selection with every key of a unit counted, K keys at a time (no cap left)."""
    units = [keys[i : i + max_keys] for keys in unit_keys for i in range(0, len(keys), max_keys)]
    return release_key_counts(units, max_keys=max_keys, **kwargs)


@pytest.mark.parametrize("extractor", ["typed", "phrases"])
@pytest.mark.parametrize(
    ("broken", "max_pairs"), [("dedupe", 1), ("dedupe", 2), ("cap", 1), ("cap", 3)]
)
def test_a_broken_dedupe_or_k_cap_is_a_leak_and_the_real_release_is_not(
    world, monkeypatch, broken, max_pairs, extractor
):
    config = FactConfig(epsilon=3.0, max_pairs=max_pairs, extractor=extractor)
    real = audit_fact_release(world.documents, config, canaries=300, seed=0)
    assert real.repeats > 1 and real.over_k_records == 3 * real.repeats
    assert real.repeated_released == 0 and real.beyond_k_released == 0 and not real.leak
    if broken == "dedupe":
        monkeypatch.setattr(facts, "record_pairs", _each_statement)
        monkeypatch.setattr(facts, "record_fact_keys", _each_statement_typed)
        monkeypatch.setattr(facts, "release_key_counts", _each_repeat_counted)
    else:
        monkeypatch.setattr(facts, "record_pairs", _every_pair)
        monkeypatch.setattr(facts, "record_fact_keys", _every_fact_typed)
        monkeypatch.setattr(facts, "release_key_counts", _k_at_a_time)
    result = audit_fact_release(world.documents, config, canaries=300, seed=0)
    assert result.leak and result.verdict == "leak"
    if broken == "dedupe":  # the repeated canaries, released almost surely: the card check
        assert result.repeated_released >= result.included // 4  # about half are repeated
        assert result.card_check_p < 1e-6 and result.beyond_k_released == 0
    else:  # the groups' shared pairs, past every record's K: never released by the real one
        assert result.beyond_k_released >= 1 and result.repeated_released == 0


def test_over_k_canaries_state_their_shared_pair_past_k():
    import numpy as np

    for k in (1, 2, 4):
        records, shared = make_over_k_canaries(2, 3, k, np.random.default_rng(0), set())
        assert len(records) == 6 and len(shared) == 4
        for text in records:  # typed: the shared pair is a fact, after the first K
            typed = record_fact_keys(text, 10**6)
            assert not any(name in key for key in typed[:k] for name in shared)
            assert any(all(n in shared for n in key.split(" | ")) for key in typed[k:])
            assert len(record_pairs(text, k)) == k
            assert not any(name in p for p in record_pairs(text, k) for name in shared)
            assert any(pair_key(*sorted(shared)[:2]) == p or name in p
                       for p in record_pairs(text, 10**6) for name in shared)  # fmt: skip
    repeated = make_canaries(4, np.random.default_rng(0), set(), repeats=5)
    assert [len(record_phrases(t)) for t in repeated] == [1, 5, 1, 5]
    assert all(len(record_pairs(t, 10)) == 1 for t in repeated)  # one pair, however stated


def test_a_verdict_resting_on_the_f_dp_bound_alone_says_it_tests_a_stronger_claim(world):
    # 300 canaries: epsilon-count cap 3.59, f-DP cap 7.31; a claim of 5 lies between
    result = audit_fact_release(world.documents, FactConfig(epsilon=5.0), canaries=300, seed=0)
    assert result.epsilon_cap_count <= 5.0 < result.epsilon_cap and not result.leak
    assert result.verdict.startswith("no leak found (by the f-DP bound alone")
    assert "Gaussian mechanism's trade-off curve" in result.verdict
    assert "stronger claim than the card's (epsilon, delta)-DP" in result.verdict
    assert f"its cap is {result.epsilon_cap_count:.3g}" in result.verdict
    fdp_only = dataclasses.replace(result, epsilon_lower_bound_fdp=6.0)
    assert fdp_only.leak and fdp_only.verdict.startswith("leak (by the f-DP bound alone")
    assert "the card's own claim is not shown broken" in fdp_only.verdict
    card = dataclasses.replace(fdp_only, card_check_p=1e-3)  # the card's own figure: plain
    assert card.verdict == "leak"
    below = dataclasses.replace(result, claimed_epsilon=3.0)  # the count bound tests it
    assert below.verdict == "no leak found"
    above = dataclasses.replace(result, claimed_epsilon=8.0)
    assert above.verdict == "inconclusive"


def test_the_command_prints_the_bound_against_the_claim_and_charges_the_release(world, tmp_path):
    """The audit is a release of the collection: charged once to the ledger before its
    noise; with the scope's default cap (this audit's epsilon) a second audit is refused."""
    from synthgen.privacy.ledger import PrivacyLedger

    write_world(world, tmp_path)
    ledger = tmp_path / "ledger.sqlite"
    args = ("knowledge", "audit", "--private-corpus", tmp_path / "corpus.jsonl",
            "--epsilon", 10, "--canaries", 100, "--seed", 1, "--ledger", ledger)  # fmt: skip
    result = cli(*args, "--json")
    line = json.loads(result.stdout)
    assert line["claimed_epsilon"] == 10 and not line["leak"] and "seconds" not in line
    assert line["verdict"] == "inconclusive"  # 100 canaries cannot bound near 10
    assert line["epsilon_lower_bound"] <= 10 and line["canaries"] == 100
    [charge] = PrivacyLedger(ledger).charges("audit", "corpus")
    assert charge.stage == "knowledge-audit" and charge.epsilon == pytest.approx(10)
    again = cli(*args, check=False)  # exit 2, a refusal: 1 would say "leak"
    assert again.returncode == 2 and "error:" in again.stderr and again.stdout == ""
    assert PrivacyLedger(ledger).charges("audit", "corpus") == [charge]


def test_an_audit_the_release_would_refuse_is_refused_before_the_ledger(world, tmp_path):
    """A refused audit (here delta not below 1/n) changes nothing: no ledger file, so the
    corrected command runs."""
    write_world(world, tmp_path)
    ledger = tmp_path / "ledger.sqlite"
    args = ("knowledge", "audit", "--private-corpus", tmp_path / "corpus.jsonl",
            "--epsilon", 10, "--canaries", 100, "--seed", 1, "--ledger", ledger)  # fmt: skip
    refused = cli(*args, "--delta", 0.5, check=False)
    assert refused.returncode == 2 and "refused before any charge" in refused.stderr
    assert "not below 1/n" in refused.stderr and not ledger.exists()
    assert json.loads(cli(*args, "--json").stdout)["claimed_epsilon"] == 10

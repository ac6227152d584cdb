"""`synthgen.knowledge`: the one-time DP knowledge release (tiny LM, tiny worlds).

Privacy: the composed guarantee recomputed with dp_accounting from the stated parts;
brute-force neighbours for both histograms' sensitivities and the L-cluster bound; a
keyword held by one record (a canary) never released; shards join to the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections import Counter

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from retriever.rag.medical import MedicalWorldConfig, make_world
from synthgen.knowledge import (
    MEDICAL_FIELD_VALUES,
    MEDICAL_FIELDS,
    KnowledgeConfig,
    plan_release,
    release,
    release_knowledge,
)
from synthgen.knowledge.clusters import assign_clusters
from synthgen.knowledge.fields import candidate_logprobs, release_field
from synthgen.knowledge.keywords import cooccurrence_counts, record_keywords
from synthgen.knowledge.release import distinct_clusters
from synthgen.lm_backends import TinyLM
from synthgen.privacy import PrivacyLedger, Scope
from synthgen.privacy.partition_selection import release_key_counts

CONFIG = KnowledgeConfig(
    epsilon=10.0, delta=1e-6, voters=4, public_pool_size=8, max_clusters=6, keyword_share=0.4,
    fields=MEDICAL_FIELDS, field_values=MEDICAL_FIELD_VALUES,
)  # fmt: skip
CANARY = "zqxcanaryvorpal"


@functools.cache
def _plan(config: KnowledgeConfig):
    return plan_release(config)


@pytest.fixture(autouse=True)
def _plan_once(monkeypatch):
    monkeypatch.setattr(release, "plan_release", _plan)


def _texts(records: int = 120, diseases: int = 3) -> list[str]:
    world = make_world(MedicalWorldConfig(num_diseases=diseases, num_records=records, seed=3))
    return [r.text for r in world.records]


def _token_count(word: str) -> int:
    return len(TinyLM().encode(" " + word))


def test_plan_composes_to_its_stated_parts_with_dp_accounting():
    plan = _plan(CONFIG)
    assert plan.epsilon <= CONFIG.epsilon and plan.delta == CONFIG.delta
    # recomposed here from the card's parts with dp-accounting's PLD primitives
    grid = {"value_discretization_interval": 1e-4}
    keywords = pld_lib.from_privacy_parameters(
        pld_lib.common.DifferentialPrivacyParameters(plan.keyword_epsilon, plan.keyword_delta),
        **grid,
    )
    clusters = pld_lib.from_gaussian_mechanism(plan.cluster_noise_multiplier, **grid)
    draws = CONFIG.clusters_per_record * CONFIG.records_per_cluster * len(CONFIG.fields)
    fields = pld_lib.from_gaussian_mechanism(
        plan.generation.noise_multiplier,
        sampling_prob=CONFIG.voters / CONFIG.public_pool_size,
        **grid,
    ).self_compose(draws)
    epsilon = keywords.compose(clusters).compose(fields).get_epsilon_for_delta(CONFIG.delta)
    assert epsilon == pytest.approx(plan.epsilon, rel=0.02)
    stages = {s["stage"]: s for s in plan.to_dict()["stages"]}
    assert stages["cluster-keywords"]["l2_sensitivity"] == pytest.approx(math.sqrt(2 * 5))
    assert stages["keywords"]["l2_sensitivity"] == pytest.approx(math.sqrt(6))


def test_more_epsilon_means_less_noise():
    low = _plan(KnowledgeConfig(epsilon=3.0, delta=1e-6))
    high = _plan(KnowledgeConfig(epsilon=10.0, delta=1e-6))
    assert high.cluster_noise_multiplier < low.cluster_noise_multiplier
    assert high.generation.noise_multiplier < low.generation.noise_multiplier
    assert high.keyword_epsilon > low.keyword_epsilon


def test_keyword_histogram_moves_by_at_most_sqrt_k_per_record():
    texts = _texts(60)
    k = CONFIG.max_keywords
    keywords = record_keywords(texts, max_keywords=k, token_count=_token_count)
    full = Counter(w for words in keywords for w in set(words))
    worst = 0.0
    for i in range(len(texts)):
        without = Counter(w for j, words in enumerate(keywords) if j != i for w in set(words))
        diff = [full[w] - without[w] for w in full]
        assert all(d in (0, 1) for d in diff)
        worst = max(worst, math.sqrt(sum(d * d for d in diff)))
    assert 0 < worst <= math.sqrt(k)


def test_cluster_counts_move_by_at_most_sqrt_l_k_minus_1_and_reach_l_clusters():
    texts = _texts(60)
    keywords = record_keywords(texts, max_keywords=CONFIG.max_keywords, token_count=_token_count)
    vocabulary = [w for w, n in Counter(w for ws in keywords for w in ws).most_common() if n > 2]
    clusters = len(vocabulary)
    members = assign_clusters(keywords, vocabulary, CONFIG.clusters_per_record)
    full = cooccurrence_counts(keywords, members, vocabulary, clusters)
    bound = math.sqrt(CONFIG.clusters_per_record * (CONFIG.max_keywords - 1))
    for i in range(len(texts)):
        kw = keywords[:i] + keywords[i + 1 :]
        others = assign_clusters(kw, vocabulary, CONFIG.clusters_per_record)
        assert others == members[:i] + members[i + 1 :]  # nobody else's clusters move
        diff = full - cooccurrence_counts(kw, others, vocabulary, clusters)
        assert np.linalg.norm(diff) <= bound + 1e-9
        assert len(np.flatnonzero(np.abs(diff).sum(axis=1))) <= CONFIG.clusters_per_record


def test_pipelinedp_releases_rare_keys_at_most_at_the_selection_rate():
    """A key of one unit is released with probability keep_probability(1) = 2.5e-7 here
    (python-dp's closed form; 1 in 11 million trials measured against 2.8 expected), so
    among 8,000 such keys more than 2 releases would happen with probability below 1e-9:
    a broken threshold fails this, a rare event allowed by delta does not."""
    from synthgen.privacy.partition_selection import keep_probability

    assert keep_probability(1, 1.0, 1e-6, 2) < 1e-6
    units = [["common", f"rare-{i}"] for i in range(400)]
    rare = 0
    for _ in range(20):  # python-dp's own secure noise: a fresh draw each time
        out = release_key_counts(units, epsilon=1.0, delta=1e-6, max_keys=2)
        assert list(out.counts)[0] == "common"
        assert out.counts["common"] == pytest.approx(400, abs=60)
        rare += len(out.counts) - 1
    assert rare <= 2


def test_release_key_counts_validates():
    for bad in ({"epsilon": 0.0}, {"epsilon": math.inf}, {"delta": 1.0}, {"max_keys": 0}):
        kwargs = {"epsilon": 1.0, "delta": 1e-6, "max_keys": 2} | bad
        with pytest.raises(ValueError):
            release_key_counts([["a"]], **kwargs)


def test_distinct_clusters_skip_keywords_a_kept_cluster_names():
    named = [["tostex", "stibrenish", "plostuxoline"], ["stibrenish", "tostex"], ["madox", "a"]]
    assert distinct_clusters(named, 5) == [0, 2]
    assert distinct_clusters(named, 1) == [0]
    assert distinct_clusters(named, 5, [False, True, True]) == [1, 2]  # not cohesive: skipped


def test_a_field_reads_only_its_candidates_at_a_fixed_shape():
    texts = _texts(40)
    plan = _plan(CONFIG)
    calls = []

    class Counting(TinyLM):
        def score(self, prompts):
            calls.append(len(prompts))
            return super().score(prompts)

    pool = np.arange(len(texts))
    for size in (len(texts), 3):  # the batch does not depend on how many records join
        calls.clear()
        out = release_field(Counting(), texts, pool[:size], "Diagnosis", ["alpha", "beta",
                            "gamma"], 2, plan, np.random.default_rng(0))  # fmt: skip
        assert len(out) == 2 and set(out) <= {"alpha", "beta", "gamma"}
        assert sum(calls) == (CONFIG.voters + 1) * sum(
            len(TinyLM().encode(" " + w.capitalize())) for w in ("alpha", "beta", "gamma")
        )


def test_the_medical_examples_fit_the_default_fields():
    from synthgen.knowledge.config import MEDICAL_FIELD_EXAMPLES

    config = KnowledgeConfig(
        epsilon=1.0,
        delta=1e-6,
        fields=MEDICAL_FIELDS,
        field_values=MEDICAL_FIELD_VALUES,
        field_examples=MEDICAL_FIELD_EXAMPLES,
    )
    assert len(config.field_examples) == 2 and KnowledgeConfig(1.0, 1e-6).field_examples == ()


def test_field_votes_read_the_public_examples_then_one_record():
    rows = []

    class Recording(TinyLM):
        def score(self, prompts):
            rows.extend(prompts)
            return super().score(prompts)

    lm = Recording()
    examples = [("Jane had a cough. Diagnosis: flu.", "Flu"), ("Mark had hay fever.", "Hay")]
    out = candidate_logprobs(lm, ["", "my rec"], "Diagnosis", ["alpha"], 12, examples)
    assert out.shape == (2, 1)
    shown = "Record: Jane had a cough. Diagnosis: flu.\nDiagnosis: Flu\n\n"
    shown += "Record: Mark had hay fever.\nDiagnosis: Hay\n\nRecord:"
    head = lm.encode(shown, bos=True)
    assert rows and all(list(r[: len(head)]) == head for r in rows)
    own = lm.encode(" my rec")
    assert sum(list(r[len(head) : len(head) + len(own)]) == own for r in rows) == len(rows) // 2


def _release(texts, work, seed, **kwargs):
    return release_knowledge(TinyLM(), texts, CONFIG, work=work,
                             rng=np.random.default_rng(seed), **kwargs)  # fmt: skip


@pytest.mark.slow
def test_a_canary_keyword_is_never_released(tmp_path):
    texts = _texts(150) + [f"A patient came in with {CANARY} spots. The diagnosis was grippe."]
    for seed in range(6):
        work = tmp_path / f"w{seed}"
        out = _release(texts, work, seed)
        assert out.complete and out.records  # something was released
        public = json.dumps([out.records, out.keyword_counts, out.clusters]).lower()
        assert CANARY not in public
        state = json.loads((work / release.STATE_FILE).read_text())
        assert CANARY not in json.dumps([state["keyword_counts"], state["clusters"]])


@pytest.mark.slow
def test_shards_join_to_the_bytes_of_one_job(tmp_path):
    texts = _texts(150)
    first = _release(texts, tmp_path / "a", 1, shard=(0, 2))
    assert not first.complete and first.clusters_done < len(first.clusters)
    # the same prepared state, then all clusters in one job
    (tmp_path / "b").mkdir(mode=0o700)
    state = (tmp_path / "a" / release.STATE_FILE).read_text()
    (tmp_path / "b" / release.STATE_FILE).write_text(state)
    whole = _release(texts, tmp_path / "b", 99)
    joined = _release(texts, tmp_path / "a", 99, shard=(1, 2))
    assert joined.complete and whole.complete
    assert json.dumps(joined.records) == json.dumps(whole.records)


@pytest.mark.slow
def test_the_ledger_is_charged_once_before_any_noise(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.ensure_scope(Scope("release", "records", CONFIG.epsilon, CONFIG.delta))
    texts = _texts(150)
    out = _release(texts, tmp_path / "w", 0, ledger=ledger, ledger_scope=("release", "records"))
    charges = ledger.charges("release", "records")
    assert [c.stage for c in charges] == ["knowledge-release"]
    assert ledger.spent("release", "records").epsilon == pytest.approx(out.plan.epsilon, rel=1e-3)
    # a restart finds the state: nothing charged again
    _release(texts, tmp_path / "w", 0, ledger=ledger, ledger_scope=("release", "records"))
    assert len(ledger.charges("release", "records")) == 1
    # a ledger that cannot pay refuses before any state is written
    poor = PrivacyLedger(tmp_path / "poor.sqlite")
    poor.ensure_scope(Scope("release", "records", 1.0, CONFIG.delta))
    from synthgen.privacy import BudgetExceededError

    with pytest.raises(BudgetExceededError):
        _release(texts, tmp_path / "w2", 0, ledger=poor, ledger_scope=("release", "records"))
    assert not (tmp_path / "w2" / release.STATE_FILE).exists()
    assert poor.charges("release", "records") == []


def test_bad_configs_are_refused():
    for bad in (
        {"epsilon": 0.0},
        {"delta": 1.0},
        {"keyword_share": 0.6, "cluster_keyword_share": 0.5},
        {"clusters_per_record": 7},
        {"voters": 64, "public_pool_size": 32},
        {"fields": ("A",), "field_values": (1, 2)},
        {"field_values": (0, 1, 1)},
        {"field_examples": (("a record", ("only one value",)),)},
    ):
        with pytest.raises(ValueError):
            KnowledgeConfig(**({"epsilon": 1.0, "delta": 1e-6} | bad))


def test_no_keyword_at_all_is_an_empty_release():
    out = release_key_counts([[], []], epsilon=1.0, delta=1e-6, max_keys=2)
    assert out.counts == {}


@pytest.mark.slow
def test_a_work_folder_refuses_another_collection(tmp_path):
    texts = _texts(150)
    _release(texts, tmp_path / "w", 0, shard=(0, 3))
    other = [t.replace("Patient", "Client") for t in texts]  # same size, other records
    with pytest.raises(ValueError, match="another collection"):
        _release(other, tmp_path / "w", 0, shard=(1, 3))


def test_min_tokens_leaves_common_words_out():
    counts = {"swelling": 1, "tostex": 3, "statirish": 4, "jonah": 2}
    text = "Jonah came in with statirish swelling; diagnosed with Tostex."
    kept = record_keywords([text], max_keywords=6, token_count=counts.get, min_tokens=2)
    assert kept == [["statirish", "tostex", "jonah"]]
    everything = record_keywords([text], max_keywords=6, token_count=counts.get)
    assert everything == [["statirish", "tostex", "jonah", "swelling"]]


def test_review_findings_delta_below_one_over_n_and_the_key_is_forgotten(tmp_path):
    texts = [f"Record {i} about quinaxitis and dabaxozane." for i in range(40)]
    with pytest.raises(ValueError, match="1/n"):
        release_knowledge(TinyLM(), texts, dataclasses.replace(CONFIG, delta=0.05),
                          work=tmp_path / "w0")  # fmt: skip
    result = release_knowledge(TinyLM(), texts, CONFIG, work=tmp_path / "w1",
                               rng=np.random.default_rng(0))  # fmt: skip
    assert result.complete
    state = json.loads((tmp_path / "w1" / release.STATE_FILE).read_text())
    assert state["key"] is None  # the noise cannot be replayed from the work folder
    stages = _plan(CONFIG).stages()
    assert all("not to their sum" in s["note"] for s in stages)
    assert 0 <= stages[0]["singleton_release_probability"] <= CONFIG.delta

"""Keyword-conditioned DP few-shot documents (`synthgen.fewshot.topics`) and the few-shot
changes it needs: small pools, extra RVP candidates, overlapping pools (tiny LM)."""

import dataclasses
import functools
import math
from collections import Counter

import numpy as np
import pytest

from synthgen import fewshot
from synthgen.fewshot import mechanism, sampling, topics
from synthgen.fewshot.plan import plan_for, plan_privacy
from synthgen.fewshot.topics import TopicConfig, document_keywords, plan_topics
from synthgen.lm_backends import TinyLM
from synthgen.privacy import BudgetExceededError, PrivacyLedger, Scope, accounting

# A hand-written private collection: three invented diseases, 40 records each, each record
# naming its disease and two symptoms (the only words of 5+ letters), and one canary record
# whose invented word no other record holds.
DISEASES = {
    "quinaxitis": ("shivers", "blisters"),
    "bruvelosis": ("wheezing", "cramps"),
    "tremadoria": ("itching", "swelling"),
}
FREQUENT = set(DISEASES) | {s for pair in DISEASES.values() for s in pair}
PEOPLE = ("Ana", "Bo", "Ida", "Li", "Max", "Eve")
CANARY = "zorblaxquint"
CANARY_DOC = f"Ana had quinaxitis with {CANARY} and shivers, case 999."
TEXTS = [
    f"{PEOPLE[i % len(PEOPLE)]} had {name} with {a} and {b}, case {i}."
    for name, (a, b) in DISEASES.items()
    for i in range(40)
] + [CANARY_DOC]

FEWSHOT = fewshot.FewShotConfig(
    public_pool_size=8, subsets=4, shots=1, max_new_tokens=16, public_vocab=10,
    resample="example", target_epsilon=1.0,
)  # fmt: skip
# topics: eps 2.4 -> sigma ~3.6, tau ~19: counts of 40 pass, a count of 1 does not.
CONFIG = TopicConfig(
    epsilon=8.0, delta=1e-5, fewshot=FEWSHOT, max_keywords=4, pools_per_document=2,
    max_topics=8, per_topic=2, keyword_candidates=True,
)  # fmt: skip

# plan_topics is a deterministic function of its frozen, public config and takes seconds
# (two calibrations); the tests of one config share its plan.
_cached_plan_topics = functools.cache(plan_topics)


@pytest.fixture(autouse=True)
def _plan_once(monkeypatch):
    monkeypatch.setattr(topics, "plan_topics", _cached_plan_topics)


@pytest.fixture
def spy(monkeypatch):
    """Records the arguments of the generation stage (and whether noise was drawn)."""
    calls = {"generate": [], "histogram": 0}
    generate, histogram = topics.generate, topics.gaussian_sparse_histogram

    def generate_spy(lm, rows, targets, template, config, **kwargs):
        calls["generate"].append({"rows": rows, "targets": targets, "config": config, **kwargs})
        return generate(lm, rows, targets, template, config, **kwargs)

    def histogram_spy(*args, **kwargs):
        calls["histogram"] += 1
        return histogram(*args, **kwargs)

    monkeypatch.setattr(topics, "generate", generate_spy)
    monkeypatch.setattr(topics, "gaussian_sparse_histogram", histogram_spy)
    return calls


def _tokens(word: str) -> int:
    return len(TinyLM().encode(" " + word))


def _ledger(tmp_path, epsilon_cap=CONFIG.epsilon):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "d", epsilon_cap, CONFIG.delta))
    return ledger


# ---- keywords -----------------------------------------------------------------------------


def test_document_keywords_public_rule():
    text = "Patients presented Zorblax-Quint, FEVER and fever; 12345 abcd wheezing wheezing."
    # stopwords (patients, presented), short words (abcd) and numbers out; lowercase,
    # distinct; longest (most tokens) first.
    assert document_keywords(text, max_keywords=5, token_count=len) == [
        "zorblax-quint", "wheezing", "fever",
    ]  # fmt: skip
    assert document_keywords(text, max_keywords=2, token_count=len) == ["zorblax-quint", "wheezing"]
    # ties keep the order of first appearance
    assert document_keywords("gamma alpha beta5 delta", max_keywords=3, token_count=len) == [
        "gamma", "alpha", "delta",
    ]  # fmt: skip
    assert document_keywords("tiny words only", max_keywords=3, token_count=len) == ["words"]
    assert document_keywords("", max_keywords=3, token_count=len) == []
    assert document_keywords("gamma delta", max_keywords=3, token_count=len, min_chars=6) == []


def test_document_keywords_rank_by_the_tokenizer():
    def count(word):
        return {"apple": 9, "banana": 1}.get(word, 3)

    assert document_keywords("banana cherry apple", max_keywords=3, token_count=count) == [
        "apple", "cherry", "banana",
    ]  # fmt: skip


def test_document_keywords_depend_on_the_document_only():
    alone = [document_keywords(t, max_keywords=4, token_count=_tokens) for t in TEXTS]
    reordered = [document_keywords(t, max_keywords=4, token_count=_tokens) for t in TEXTS[::-1]]
    assert alone == reordered[::-1]
    assert alone[-1] == [CANARY, "quinaxitis", "shivers"]
    assert alone[0] == ["quinaxitis", "blisters", "shivers"]


# ---- configs and plans ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"epsilon": 0.0},
        {"epsilon": math.inf},
        {"delta": 1.0},
        {"topic_share": 0.0},
        {"topic_share": 1.0},
        {"max_keywords": 0},
        {"per_topic": 0},
        {"max_topics": 0},
        {"pools_per_document": 0},
        {"pools_per_document": 5},  # more than max_keywords
    ],
)
def test_topic_config_refuses_bad_values(changes):
    with pytest.raises(ValueError):
        dataclasses.replace(CONFIG, **changes)


def test_plan_topics_composes_within_epsilon():
    plan = topics.plan_topics(CONFIG)
    half = CONFIG.delta / 2
    assert plan.epsilon <= CONFIG.epsilon and plan.delta == CONFIG.delta
    assert plan.topics.epsilon <= CONFIG.epsilon * CONFIG.topic_share
    assert plan.topics.delta == half and plan.documents.delta == half
    assert plan.documents.epsilon <= CONFIG.epsilon * (1 - CONFIG.topic_share) * (1 + 1e-9)
    assert plan.topics.max_keys == CONFIG.max_keywords
    assert plan.documents.pools_per_example == CONFIG.pools_per_document
    assert plan.documents.tokens == CONFIG.per_topic * FEWSHOT.max_new_tokens
    composed = accounting.compose([plan.topics.event, plan.documents.event])
    assert accounting.event_to_json(plan.event) == accounting.event_to_json(composed)
    assert accounting.epsilon(plan.event, CONFIG.delta) == pytest.approx(plan.epsilon, rel=1e-9)
    # the generation config carries the fixed noise, small pools allowed
    assert plan.fewshot.target_epsilon is None
    assert plan.fewshot.noise_multiplier == plan.documents.noise_multiplier
    assert plan.fewshot.allow_small_pools and plan.fewshot.delta == half
    stages = plan.to_dict()["stages"]
    assert [s["stage"] for s in stages] == ["topics", "documents"]


# ---- the release ----------------------------------------------------------------------------


def test_release_charges_two_stages_within_epsilon(tmp_path, spy):
    ledger = _ledger(tmp_path)
    release = topics.release_topic_documents(
        TinyLM(), TEXTS, CONFIG, rng=np.random.default_rng(0), ledger=ledger,
        ledger_scope=("t", "d"),
    )  # fmt: skip
    charges = ledger.charges("t", "d")
    assert [c.stage for c in charges] == ["topics", "fewshot-generate"]
    events = [accounting.event_from_json(c.event) for c in charges]
    assert accounting.event_to_json(events[0]) == accounting.event_to_json(
        release.plan.topics.event
    )
    assert accounting.event_to_json(events[1]) == accounting.event_to_json(
        release.plan.documents.event
    )
    composed = accounting.epsilon(accounting.compose(events), CONFIG.delta)
    assert composed <= CONFIG.epsilon
    assert composed == pytest.approx(release.plan.epsilon, rel=1e-6)
    assert ledger.spent("t", "d").epsilon <= CONFIG.epsilon
    assert len(spy["generate"]) == 1 and spy["generate"][0]["ledger"] is ledger


def test_release_refuses_before_any_charge_when_both_stages_do_not_fit(tmp_path, spy):
    plan = topics.plan_topics(CONFIG)
    topics_alone = accounting.epsilon(plan.topics.event, CONFIG.delta)
    cap = (topics_alone + plan.epsilon) / 2  # pays for the topics, not for both
    ledger = _ledger(tmp_path, epsilon_cap=cap)
    with pytest.raises(BudgetExceededError):
        topics.release_topic_documents(
            TinyLM(), TEXTS, CONFIG, rng=np.random.default_rng(0), ledger=ledger,
            ledger_scope=("t", "d"),
        )  # fmt: skip
    assert ledger.charges("t", "d") == []
    assert spy["histogram"] == 0 and spy["generate"] == []
    with pytest.raises(ValueError, match="ledger_scope"):
        topics.release_topic_documents(
            TinyLM(), TEXTS, CONFIG, rng=np.random.default_rng(0), ledger=ledger
        )
    assert ledger.charges("t", "d") == []


def test_frequent_keywords_become_topics_with_per_topic_documents(spy):
    release = topics.release_topic_documents(TinyLM(), TEXTS, CONFIG, rng=np.random.default_rng(1))
    counts = release.keyword_counts
    assert set(counts) == FREQUENT  # the nine words of 40 records each, nothing else
    tau = release.plan.topics.threshold
    assert all(c >= tau for c in counts.values())
    sigma = release.plan.topics.noise_std
    assert all(abs(c - 40) < 6 * sigma for c in counts.values())
    chosen = list(counts)[: CONFIG.max_topics]
    assert release.topics == [w for w in chosen for _ in range(CONFIG.per_topic)]
    assert len(release.texts) == len(release.topics) == CONFIG.max_topics * CONFIG.per_topic
    assert 0 < release.tokens_released <= len(release.texts) * FEWSHOT.max_new_tokens
    (call,) = spy["generate"]
    assert call["targets"] == [{"label": t} for t in release.topics]
    assert call["pool_field"] == "label"
    # the released keywords' tokens (public once released) join the RVP candidates
    words = {t for w in chosen for t in TinyLM().encode(" " + w) + TinyLM().encode(w)}
    assert call["config"].extra_candidates == tuple(sorted(words))


def test_pools_per_document_and_the_release_order(spy):
    release = topics.release_topic_documents(TinyLM(), TEXTS, CONFIG, rng=np.random.default_rng(2))
    chosen = list(release.keyword_counts)[: CONFIG.max_topics]
    rows = spy["generate"][0]["rows"]
    per_document = Counter(row["text"] for row in rows)
    assert max(per_document.values()) <= CONFIG.pools_per_document
    for text in TEXTS:
        own = document_keywords(text, max_keywords=CONFIG.max_keywords, token_count=_tokens)
        expected = sorted((w for w in own if w in chosen), key=chosen.index)
        labels = [row["label"] for row in rows if row["text"] == text]
        assert labels == expected[: CONFIG.pools_per_document]


@pytest.mark.parametrize("seed", [3, 4])
def test_a_keyword_of_one_document_is_not_released(spy, seed):
    release = topics.release_topic_documents(
        TinyLM(), TEXTS, CONFIG, rng=np.random.default_rng(seed)
    )
    assert CANARY not in release.keyword_counts and CANARY not in release.topics
    assert release.keyword_counts  # the frequent words were released in the same run
    assert not any(CANARY in text for text in release.texts)
    assert not any(CANARY[:6] in text for text in release.texts)
    # the canary's record was a private shot of its released keywords' pools all the same
    assert any(row["text"] == CANARY_DOC for row in spy["generate"][0]["rows"])


def test_no_topic_released_charges_the_topics_only(tmp_path, spy):
    ledger = _ledger(tmp_path)
    rare = [f"{p} had zymotic{p.lower()}xx fever." for p in PEOPLE]  # counts of 1
    release = topics.release_topic_documents(
        TinyLM(), rare, CONFIG, rng=np.random.default_rng(5), ledger=ledger,
        ledger_scope=("t", "d"),
    )  # fmt: skip
    assert release.keyword_counts == {} and release.texts == [] and release.topics == []
    assert release.tokens_released == 0 and spy["generate"] == []
    assert [c.stage for c in ledger.charges("t", "d")] == ["topics"]


# ---- the few-shot changes: small pools, overlapping pools, extra candidates ---------------


def _fewshot(**changes):
    values = dict(public_pool_size=8, subsets=4, shots=1, max_new_tokens=6, noise_multiplier=3.0)
    return fewshot.FewShotConfig(**{**values, **changes})


def test_min_pool_size_and_extra_candidates_validation():
    assert _fewshot().min_pool_size == 8
    assert _fewshot(allow_small_pools=True).min_pool_size == 0
    assert _fewshot(extra_candidates=(3, 0, 7)).extra_candidates == (3, 0, 7)
    for bad in [(-1,), (1.5,), ("a",)]:
        with pytest.raises(ValueError, match="extra_candidates"):
            _fewshot(extra_candidates=bad)


def test_pools_per_example_multiplies_the_charged_tokens():
    config = _fewshot()
    plan = plan_privacy(config, 12, 3, pools_per_example=3)
    assert plan.tokens == 12 and plan.pools_per_example == 3
    same = accounting.fewshot_event(
        sampling_rate=config.sampling_rate, tokens=36, noise_multiplier=3.0
    )
    assert accounting.event_to_json(plan.event) == accounting.event_to_json(same)
    assert plan.epsilon == pytest.approx(
        accounting.fewshot_epsilon(
            plan.delta, sampling_rate=config.sampling_rate, tokens=36, noise_multiplier=3.0
        )
    )
    assert plan.epsilon > plan_privacy(config, 12, 3).epsilon
    assert plan.to_dict()["pools_per_example"] == 3
    with pytest.raises(ValueError, match="pools_per_example"):
        plan_privacy(config, 12, 3, pools_per_example=0)


def test_every_empty_pool_has_its_own_array():
    rows = [{"text": "abc", "label": "x"}] * 3
    targets = [{"label": "y"}, {"label": "z"}, {"label": "y"}, {"label": "x"}]
    pools = sampling._pools(rows, targets, "label", 0)
    assert [p.size for p in pools] == [0, 0, 0, 3]
    assert pools[0] is pools[2]  # one pool per label
    assert pools[0] is not pools[1]  # two empty pools are two pools
    assert len({id(p) for p in pools}) == 3
    plan = plan_for(
        rows, targets, fewshot.PromptTemplate("{label}\n", "{text}\n", "T:"),
        _fewshot(allow_small_pools=True), pool_field="label",
    )  # fmt: skip
    assert plan.pools == 3 and plan.tokens == 2 * 6  # label y: two targets
    with pytest.raises(ValueError, match="label='y'"):
        sampling._pools(rows, targets, "label", 1)


def test_public_candidates_add_the_extra_candidates():
    public = np.linspace(1.0, 0.1, 20)
    public /= public.sum()
    top = set(mechanism.public_candidates(public, _fewshot(public_vocab=3)).tolist())
    assert top == {0, 1, 2}
    extra = mechanism.public_candidates(
        public, _fewshot(public_vocab=3, extra_candidates=(15, 1, 19, 20, 400))
    )
    assert sorted(extra.tolist()) == [0, 1, 2, 15, 19]  # ids beyond the vocabulary dropped
    everything = mechanism.public_candidates(public, _fewshot(extra_candidates=(5,)))
    assert everything.tolist() == list(range(20))


def test_small_pools_run_when_allowed():
    rows = [{"text": "quinaxitis brings shivers", "label": "quinaxitis"}] * 2  # < 8 declared
    targets = [{"label": "quinaxitis"}, {"label": "absent"}]
    with pytest.raises(ValueError, match="smaller than the declared"):
        fewshot.generate(TinyLM(), rows, targets, topics.TOPIC_TEMPLATE, _fewshot(),
                         pool_field="label", rng=np.random.default_rng(0))  # fmt: skip
    result = fewshot.generate(
        TinyLM(), rows, targets, topics.TOPIC_TEMPLATE, _fewshot(allow_small_pools=True),
        pool_field="label", rng=np.random.default_rng(0),
    )  # fmt: skip
    assert len(result.texts) == 2 and result.plan.pools == 2
    # the declared size, not the real one, sets the rate and the guarantee
    assert result.plan.sampling_rate == pytest.approx(4 * 1 / 8)

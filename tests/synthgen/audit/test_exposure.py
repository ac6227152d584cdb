"""Rank, exposure and its skew-normal extrapolation on hand-made scores; batched scoring
against the per-example loss of the model."""

import math

import jax
import numpy as np
import pytest
import scipy.stats

from synthgen.audit import exposure
from synthgen.generator_models import LlamaFamily


def test_rank_counts_strictly_lower_references_only():
    refs = [1.0, 2.0, 2.0, 3.0, 5.0]
    assert exposure.rank(0.5, refs) == 1
    assert exposure.rank(2.0, refs) == 2  # ties with the secret do not count
    assert exposure.rank(2.5, refs) == 4
    assert exposure.rank(9.0, refs) == 6


def test_exposure_of_a_secret_more_likely_than_every_reference_is_log2_space():
    refs = np.linspace(10.0, 20.0, 100)
    assert exposure.exposure(1.0, refs) == pytest.approx(math.log2(100))
    # the space-size case: the same rank, measured against the whole 10-digit space
    assert exposure.exposure(1.0, refs, space_size=1e10) == pytest.approx(math.log2(1e10))


def test_exposure_ties_and_the_least_likely_secret():
    refs = [3.0] * 8
    assert exposure.exposure(3.0, refs) == pytest.approx(3.0)  # all tied: rank 1
    assert exposure.exposure(4.0, refs) == pytest.approx(3.0 - math.log2(9))
    refs = [1.0, 2.0, 3.0, 4.0]
    assert exposure.exposure(2.5, refs) == pytest.approx(2.0 - math.log2(3))
    assert exposure.exposure(2.5, refs, space_size=64) == pytest.approx(6.0 - math.log2(3))


def test_exposure_rejects_bad_input():
    with pytest.raises(ValueError):
        exposure.exposure(1.0, [])
    with pytest.raises(ValueError):
        exposure.exposure(float("nan"), [1.0, 2.0])
    with pytest.raises(ValueError):
        exposure.exposure(1.0, [1.0, float("inf")])
    with pytest.raises(ValueError):
        exposure.exposure(1.0, [1.0, 2.0], space_size=0.5)


def test_extrapolation_recovers_the_tail_probability_of_a_skew_normal():
    rng = np.random.default_rng(0)
    shape, loc, scale = 3.0, 30.0, 4.0
    refs = scipy.stats.skewnorm.rvs(shape, loc, scale, size=20_000, random_state=rng)
    for p in (1e-3, 1e-6, 1e-9):
        secret = scipy.stats.skewnorm.ppf(p, shape, loc, scale)
        got = exposure.extrapolated_exposure(secret, refs, space_size=1e10)
        assert got == pytest.approx(-math.log2(p), rel=0.1)
    # a secret far beyond the space is capped at log2(space size); a typical one is ~1 bit
    assert exposure.extrapolated_exposure(-1e6, refs, space_size=1e10) == pytest.approx(
        math.log2(1e10)
    )
    median = float(np.median(refs))
    assert exposure.extrapolated_exposure(median, refs) == pytest.approx(1.0, abs=0.05)
    # the rank-based exposure agrees where references reach the tail (~20 of them: +-0.8)
    secret = scipy.stats.skewnorm.ppf(1e-3, shape, loc, scale)
    assert exposure.exposure(secret, refs, space_size=len(refs)) == pytest.approx(
        -math.log2(1e-3), abs=0.8
    )


def test_extrapolation_needs_spread_references():
    with pytest.raises(ValueError):
        exposure.extrapolated_exposure(1.0, [2.0, 3.0])
    with pytest.raises(ValueError):
        exposure.extrapolated_exposure(1.0, [2.0, 2.0, 2.0])


@pytest.fixture(scope="module")
def tiny_llama():
    from synthgen.models.llama import Llama, LlamaConfig

    class Tok:  # a character tokenizer: ids 3.. are bytes
        vocab_size, eos_id, pad_id, bos_id = 260, 1, 0, 2
        chat_template = None

        def encode(self, text):
            return [3 + b for b in text.encode()][:200]

        def decode(self, ids):
            return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")

    cfg = LlamaConfig.tiny()
    cfg = type(cfg)(**{**cfg.__dict__, "vocab_size": 260})
    ids = np.zeros((1, 4), np.int32)
    params = Llama(cfg).init(jax.random.key(0), ids)["params"]
    return LlamaFamily(cfg, Tok()), params


def test_batched_scores_equal_the_per_example_loss(tiny_llama):
    family, params = tiny_llama
    documents = ["alpha beta", "", "gamma delta epsilon", "zeta"]
    queries = ["key one 0123456789", "key two 9876543210", "k 5555555555", "x 0000000001"]
    sizes = dict(input_len=40, target_len=24)
    got = exposure.score_sequences(family, params, documents, queries, batch_size=3, **sizes)
    again = exposure.score_sequences(family, params, documents, queries, batch_size=16, **sizes)
    np.testing.assert_allclose(got.log_perplexity, again.log_perplexity, rtol=1e-5)
    data = family.encode_pairs(documents, queries, 40, 24)
    loss = family.loss_fn()
    logits_fn = family.logits_fn()
    for i in range(len(queries)):
        ex = {k: v[i] for k, v in data.items()}
        count = ex["target_mask"].sum()
        bits = float(loss(params, {}, ex)) * count / math.log(2)
        assert got.log_perplexity[i] == pytest.approx(bits, rel=1e-4)
        # greedy reproduction of the whole query (secret_start 0) <=> argmax at every token
        logits = np.asarray(logits_fn(params, ex))
        n = int(count) - 1
        expect = bool(np.all(logits[:n].argmax(-1) == ex["targets"][:n]))
        assert got.greedy_secret[i] == expect


def test_scoring_refuses_queries_longer_than_the_target_budget(tiny_llama):
    family, params = tiny_llama
    with pytest.raises(ValueError, match="target_len"):
        exposure.score_sequences(family, params, ["d"], ["x" * 30], input_len=40, target_len=24)

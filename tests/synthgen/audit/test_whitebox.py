"""White-box DP-step audit: statistics vs jax-privacy, a planted leak, DP claims, secrecy."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_privacy.auditing import CanaryScoreAuditor
from scipy import special

from synthgen.audit import auditor, whitebox

BATCH = 16


def _loss(trainable, frozen, example):
    """Per-example squared error of a linear map: 64 x 300 + 300 = 19,500 parameters."""
    pred = example["x"] @ trainable["w"] + trainable["b"]
    return jnp.mean(jnp.square(pred - example["y"]))


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    trainable = {
        "w": (0.1 * rng.normal(size=(64, 300))).astype(np.float32),
        "b": np.zeros(300, np.float32),
    }
    batch = {
        "x": rng.normal(size=(BATCH, 64)).astype(np.float32),
        "y": rng.normal(size=(BATCH, 300)).astype(np.float32),
    }
    grad_sum = whitebox.clipped_batch_sum(_loss, trainable, {}, batch, clip_norm=1.0, microbatch=4)
    return trainable, grad_sum


def _audit(toy, epsilon, seed=1, plan=None, num_canaries=1000):
    trainable, grad_sum = toy
    config = whitebox.WhiteboxConfig(num_canaries=num_canaries, epsilon=epsilon, seed=seed)
    return whitebox.audit_dp_step(grad_sum, trainable, BATCH, config, model="toy", plan=plan)


def test_score_stats_match_jax_privacy_and_project_auditor():
    rng = np.random.default_rng(7)
    ins, outs = rng.normal(1.5, 1.0, 480), rng.normal(0.0, 1.0, 520)
    stats = whitebox.score_stats("x", ins, outs, delta=1e-5)
    ref = CanaryScoreAuditor(ins, outs)
    assert stats.epsilon_one_run == pytest.approx(ref.epsilon_one_run(0.05, 1e-5), abs=1e-9)
    assert stats.epsilon_one_run_fdp == pytest.approx(ref.epsilon_one_run_fdp(0.05, 1e-5), abs=1e-9)
    # The membership audit's adapter (synthgen.audit.auditor) calls the same library.
    result = auditor.audit(ins, outs, claimed_epsilon=8.0, delta=1e-5)
    assert stats.epsilon_one_run == result.epsilon_one_run
    assert stats.auroc == result.auroc
    assert stats.tpr_at_1pct_fpr == result.tpr_at_1pct_fpr
    assert 0 < stats.epsilon_one_run < stats.epsilon_one_run_fdp  # f-DP is the tighter one


def test_statistical_cap_golden():
    # Perfect separation of 500 in / 500 out: 3 thresholds on the hull, so Bonferroni gives
    # alpha = 0.05 / 3, and all 500 "in" guesses right rejects e^eps/(1+e^eps) <= alpha^(1/500)
    # (Steinke et al. 2023, Theorem 3.1, delta -> 0): eps = logit(alpha^(1/500)) = 4.8009.
    count, fdp = whitebox.statistical_cap(500, 500, delta=1e-12)
    assert count == pytest.approx(special.logit((0.05 / 3) ** (1 / 500)), abs=1e-5)
    assert count == pytest.approx(4.8009, abs=1e-4)
    assert fdp > count


def test_step_plan_is_the_gaussian_mechanism_of_one_step():
    plan = whitebox.step_plan(whitebox.WhiteboxConfig(epsilon=8.0), BATCH)
    assert (plan.steps, plan.sampling_rate, plan.delta) == (1, 1.0, 1e-5)
    assert plan.epsilon == pytest.approx(8.0, abs=0.05)
    # Golden: the Gaussian mechanism with sigma = 0.6011 is (8, 1e-5)-DP (analytic Gaussian,
    # Balle & Wang 2018; dp-accounting's PLD gives the same to 3 digits).
    assert plan.noise_multiplier == pytest.approx(0.6011, abs=2e-3)
    nonprivate = whitebox.step_plan(whitebox.WhiteboxConfig(epsilon=math.inf), BATCH)
    assert nonprivate.noise_multiplier == 0 and math.isinf(nonprivate.epsilon)


def test_canaries_have_the_clip_norm_and_are_nearly_orthogonal():
    key = jax.random.key(3)
    u = whitebox._directions(key, jnp.int32(0), 8, 20_000)
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, rtol=1e-5)
    gram = np.asarray(u @ u.T) - np.eye(8)
    assert np.max(np.abs(gram)) < 5 / np.sqrt(20_000)
    # Adding canary i moves the clipped sum by exactly C (the relation the claim is about).
    weights = jnp.zeros(8).at[5].set(0.7)
    moved = whitebox._canary_pass(key, weights, 8, 20_000)
    assert float(jnp.linalg.norm(moved)) == pytest.approx(0.7, rel=1e-5)


def test_planted_leak_without_noise_reaches_the_cap(toy):
    result = _audit(toy, math.inf)
    assert result.noise_multiplier == 0 and not result.violation
    primary = result.primary
    assert primary.observable == "noisy_grad"
    assert primary.auroc == 1.0 and primary.tpr_at_1pct_fpr == 1.0
    assert primary.epsilon_one_run >= 0.9 * result.cap_one_run
    assert primary.epsilon_one_run_fdp >= 0.9 * result.cap_fdp
    assert result.cap_one_run > 4.5  # about 4.75 for 1,000 canaries at delta = 1e-5


@pytest.mark.parametrize("epsilon", [8.0, 1.0])
def test_dp_step_bounds_stay_below_the_claim(toy, epsilon):
    result = _audit(toy, epsilon)
    assert result.claimed_epsilon == pytest.approx(epsilon, abs=0.05)
    assert not result.violation
    for stats in result.stats:
        assert stats.epsilon_one_run <= result.claimed_epsilon
        assert stats.epsilon_one_run_fdp <= result.claimed_epsilon
    if epsilon == 8.0:  # the audit has power: the target is >= 1.5 at eps = 8
        assert result.primary.epsilon_one_run >= 1.5


def test_planted_defect_is_a_violation(toy):
    # A step that claims eps = 1 but adds a tenth of the noise: the audit must refute it.
    trainable, _ = toy
    config = whitebox.WhiteboxConfig(epsilon=1.0)
    plan = whitebox.step_plan(config, BATCH)
    weak = dataclasses.replace(plan, noise_multiplier=plan.noise_multiplier / 10)
    result = _audit(toy, 1.0, plan=weak)
    assert result.claimed_epsilon == pytest.approx(1.0, abs=0.01)
    assert result.violation
    assert result.primary.epsilon_one_run > 2.0


def test_result_holds_aggregates_only(toy):
    result = _audit(toy, 8.0, num_canaries=200)
    record = result.to_dict()
    for value in record.values():
        assert not isinstance(value, list | tuple | np.ndarray) or len(value) <= 2
    assert whitebox.WhiteboxResult.from_dict(record) == result


@pytest.mark.parametrize(
    "changes",
    [
        dict(num_canaries=1),
        dict(epsilon=0.0),
        dict(epsilon=math.nan),
        dict(delta=1e-3),  # 2 m delta > 1 for m = 1000
        dict(clip_norm=0.0),
        dict(significance=1.0),
        dict(seed=-1),
    ],
)
def test_config_validation(changes):
    with pytest.raises(ValueError):
        whitebox.WhiteboxConfig(**changes)

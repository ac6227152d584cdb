"""The Gaussian sparse histogram: its plan, its event, its noise law, its threshold, its
contribution bound (statistical tests with fixed seeds)."""

import math
from collections import Counter

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import optimize, stats

from synthgen.privacy import accounting
from synthgen.privacy.rng import secure_rng
from synthgen.privacy.sparse_histogram import (
    SparseHistogramPlan,
    gaussian_sparse_histogram,
    plan_sparse_histogram,
    sparse_histogram_event,
    threshold_delta,
    unit_keys,
)

EPSILON, DELTA, MAX_KEYS = 1.0, 1e-5, 4


@pytest.fixture(scope="module")
def plan():
    return plan_sparse_histogram(EPSILON, DELTA, MAX_KEYS)


def _fixed(noise_std: float, threshold: float, max_keys: int) -> SparseHistogramPlan:
    """A plan with chosen noise and threshold (its epsilon is not used by the mechanism)."""
    dt = min(threshold_delta(noise_std, threshold, max_keys), 0.999)
    return SparseHistogramPlan(max_keys, noise_std, threshold, dt, math.inf, 0.5)


# ---- the plan and its accounting --------------------------------------------------------


def test_plan_meets_epsilon_and_is_tight(plan):
    assert plan.delta == DELTA and plan.max_keys == MAX_KEYS
    assert plan.epsilon <= EPSILON
    assert plan.epsilon >= 0.995 * EPSILON
    # 2% less noise (same delta split) would exceed the target: the noise is the least.
    sigma = 0.98 * plan.noise_std
    tau = 1.0 + sigma * stats.norm.isf(DELTA / 2 / MAX_KEYS)
    tighter = sparse_histogram_event(sigma, MAX_KEYS, threshold_delta(sigma, tau, MAX_KEYS))
    assert accounting.epsilon(tighter, DELTA) > EPSILON


def test_plan_gives_half_of_delta_to_the_threshold(plan):
    assert plan.threshold_delta == pytest.approx(DELTA / 2, rel=1e-9)
    assert plan.threshold == pytest.approx(
        1.0 + plan.noise_std * stats.norm.isf(DELTA / 2 / MAX_KEYS), rel=1e-12
    )


def test_threshold_delta_formula():
    # Q(3) = 0.0013498980316300946 (standard normal upper tail at 3, tables / mpmath).
    assert threshold_delta(2.0, 7.0, 3) == pytest.approx(3 * 0.0013498980316300946, rel=1e-12)
    for sigma, tau, k in [(0.5, 3.0, 1), (4.0, 20.0, 8), (1.3, 1.0, 2)]:
        assert threshold_delta(sigma, tau, k) == pytest.approx(
            k * stats.norm.sf((tau - 1.0) / sigma), rel=1e-12
        )
    assert threshold_delta(1.3, 1.0, 2) == pytest.approx(1.0)  # tau = 1: a coin flip per key


def test_event_is_gaussian_composed_with_threshold_delta(plan):
    event = plan.event
    assert isinstance(event, dp_event.ComposedDpEvent)
    gaussian, threshold = event.events
    assert isinstance(gaussian, dp_event.GaussianDpEvent)
    assert gaussian.noise_multiplier == pytest.approx(plan.noise_std / math.sqrt(MAX_KEYS))
    assert isinstance(threshold, accounting.EpsilonDeltaDpEvent)
    assert (threshold.epsilon, threshold.delta) == (0.0, plan.threshold_delta)
    same = accounting.compose(
        [
            accounting.gaussian_event(plan.noise_std / math.sqrt(MAX_KEYS)),
            accounting.epsilon_delta_event(0.0, plan.threshold_delta),
        ]
    )
    assert accounting.epsilon(same, DELTA) == pytest.approx(plan.epsilon, rel=1e-9)
    assert accounting.epsilon(event, DELTA) == pytest.approx(plan.epsilon, rel=1e-9)
    assert sparse_histogram_event(2.0, 4, 0.0) == accounting.gaussian_event(1.0)


def test_plan_epsilon_matches_the_analytic_gaussian(plan):
    # Composing with a (0, dt) event leaves delta - dt (over 1 - dt) to the Gaussian part;
    # the Gaussian's exact curve is Balle & Wang 2018, Thm 8:
    # delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s), s the multiplier.
    s = plan.noise_std / math.sqrt(MAX_KEYS)
    rest = (DELTA - plan.threshold_delta) / (1 - plan.threshold_delta)

    def excess(eps):
        return (
            stats.norm.cdf(1 / (2 * s) - eps * s)
            - math.exp(eps) * stats.norm.cdf(-1 / (2 * s) - eps * s)
            - rest
        )

    exact = optimize.brentq(excess, 1e-6, 50.0)
    # PLD is pessimistic by its discretisation only.
    assert exact <= plan.epsilon * (1 + 1e-6)
    assert plan.epsilon == pytest.approx(exact, rel=5e-3)


def test_plan_to_dict_names_the_unit_and_relation(plan):
    out = plan.to_dict()
    assert out["unit"] == "one document"
    assert out["neighboring_relation"] == "ADD_OR_REMOVE_ONE"
    assert out["epsilon"] == plan.epsilon and out["noise_std"] == plan.noise_std


@pytest.mark.parametrize(
    "args",
    [
        (0.0, 1e-5, 4),
        (-1.0, 1e-5, 4),
        (math.inf, 1e-5, 4),
        (math.nan, 1e-5, 4),
        (1.0, 0.0, 4),
        (1.0, 1.0, 4),
        (1.0, 1e-5, 0),
    ],
)
def test_plan_refuses_bad_arguments(args):
    with pytest.raises(ValueError):
        plan_sparse_histogram(*args)


@pytest.mark.parametrize("args", [(1.0, 0, 0.1), (1.0, 2, 1.0), (1.0, 2, -0.1), (0.0, 2, 0.1)])
def test_event_refuses_bad_arguments(args):
    with pytest.raises(ValueError):
        sparse_histogram_event(*args)


# ---- the contribution bound -------------------------------------------------------------


def test_unit_keys_dedups_then_caps_in_order():
    assert unit_keys(["b", "a", "b", "c", "a", "d"], 3) == ["b", "a", "c"]
    assert unit_keys(["a", "a", "a", "b"], 2) == ["a", "b"]  # duplicates do not use the cap
    assert unit_keys(iter(["x", "y"]), 5) == ["x", "y"]
    assert unit_keys([], 3) == []


def _counts(units, max_keys):
    counts = Counter()
    for keys in units:
        counts.update(unit_keys(keys, max_keys))
    return counts


def test_neighbours_differ_by_one_on_at_most_max_keys_keys():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(30)]
    for _ in range(200):
        units = [list(rng.choice(vocab, size=rng.integers(0, 12))) for _ in range(15)]
        extra = list(rng.choice(vocab, size=rng.integers(0, 12)))  # repeats, > max_keys
        before, after = _counts(units, MAX_KEYS), _counts([*units, extra], MAX_KEYS)
        diff = {k: after[k] - before[k] for k in set(before) | set(after)}
        changed = {k: d for k, d in diff.items() if d}
        assert len(changed) <= MAX_KEYS
        assert set(changed.values()) <= {1}
        assert len(changed) == min(MAX_KEYS, len(set(extra)))


def test_mechanism_output_moves_by_the_declared_sensitivity():
    # Neighbours whose new unit holds only keys already present: the same seed draws the
    # same noise per key, so the released counts differ exactly by the true counts'
    # difference, 1 on at most max_keys keys (L2 <= sqrt(max_keys)).
    plan = _fixed(noise_std=3.0, threshold=-1e9, max_keys=MAX_KEYS)
    vocab = [f"k{i:02d}" for i in range(20)]
    units = [vocab[i : i + 4] for i in range(0, 20, 4)] * 3 + [vocab[i : i + 3] for i in range(18)]
    extra = ["k03", "k03", "k07", "k11", "k01", "k19", "k05"]  # 7 keys, one repeated
    a = gaussian_sparse_histogram(units, plan, secure_rng(5))
    b = gaussian_sparse_histogram([*units, extra], plan, secure_rng(5))
    assert set(a) == set(b) == set(vocab)
    diff = {k: b[k] - a[k] for k in vocab}
    moved = {k for k, d in diff.items() if abs(d) > 1e-9}
    assert moved == {"k03", "k07", "k11", "k01"}  # the first max_keys distinct keys
    np.testing.assert_allclose([diff[k] for k in sorted(moved)], 1.0, atol=1e-9)
    assert math.sqrt(sum(d * d for d in diff.values())) <= math.sqrt(MAX_KEYS) + 1e-9


# ---- the mechanism ----------------------------------------------------------------------


def test_noisy_counts_have_the_plan_scale():
    sigma = 2.5
    plan = _fixed(noise_std=sigma, threshold=-1e9, max_keys=2)  # every key is released
    true = {f"key{i:03d}": 1 + i % 7 for i in range(400)}
    units = [[k] for k, c in true.items() for _ in range(c)]
    rng = secure_rng(1)
    residuals = []
    for _ in range(20):
        out = gaussian_sparse_histogram(units, plan, rng)
        assert set(out) == set(true)
        residuals += [out[k] - true[k] for k in true]
    residuals = np.asarray(residuals)
    assert stats.kstest(residuals, stats.norm(scale=sigma).cdf).pvalue > 0.01
    for wrong in (sigma * 2 / 3, sigma * 3 / 2):
        assert stats.kstest(residuals, stats.norm(scale=wrong).cdf).pvalue < 1e-6


def test_a_single_units_keys_pass_the_threshold_at_most_with_delta_t():
    # A large delta_t so that the frequency is measurable: sigma = 1, tau = 2, two keys per
    # unit; each unit holds two keys nobody else holds.
    sigma, tau, k = 1.0, 2.0, 2
    plan = _fixed(noise_std=sigma, threshold=tau, max_keys=k)
    per_key = stats.norm.sf((tau - 1) / sigma)  # Q(1) ~ 0.159
    n = 5000
    shared = [["common", "usual"]] * 40
    lonely = [[f"own{i}a", f"own{i}b", f"own{i}c"] for i in range(n)]  # the third is capped
    out = gaussian_sparse_histogram([*shared, *lonely], plan, secure_rng(2))
    assert "common" in out and "usual" in out  # count 40: far above tau
    assert not any(f"own{i}c" in out for i in range(n))
    per_unit = np.array([(f"own{i}a" in out) or (f"own{i}b" in out) for i in range(n)])
    per_key_freq = np.mean([f"own{i}{s}" in out for i in range(n) for s in "ab"])
    se = math.sqrt(per_key * (1 - per_key) / (2 * n))
    assert abs(per_key_freq - per_key) < 4 * se
    bound = threshold_delta(sigma, tau, k)
    assert bound == pytest.approx(k * per_key)
    assert per_unit.mean() <= bound + 4 * math.sqrt(bound * (1 - bound) / n)
    exact = 1 - (1 - per_key) ** k
    assert per_unit.mean() == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / n))


def test_absent_keys_are_never_released():
    plan = _fixed(noise_std=5.0, threshold=-1e9, max_keys=2)  # every counted key passes
    units = [["a", "b", "zzz-capped"], ["b", "c"], ["a", "a", "c", "zzz-capped"]]
    for seed in range(50):
        out = gaussian_sparse_histogram(units, plan, secure_rng(seed))
        assert set(out) == {"a", "b", "c"}  # no capped-out key, no key from nowhere
    assert gaussian_sparse_histogram([], plan, secure_rng(0)) == {}
    assert gaussian_sparse_histogram([[], []], plan, secure_rng(0)) == {}


def test_threshold_keeps_frequent_keys_and_drops_rare_ones(plan):
    units = [["often", f"rare{i}"] for i in range(200)]
    out = gaussian_sparse_histogram(units, plan, secure_rng(3))
    assert list(out) == ["often"]  # count 200 >> tau ~ 38; counts of 1 stay below
    assert out["often"] == pytest.approx(200, abs=6 * plan.noise_std)


def test_output_sorted_by_descending_noisy_count_and_independent_of_unit_order():
    plan = _fixed(noise_std=4.0, threshold=-1e9, max_keys=3)
    rng = np.random.default_rng(4)
    units = [[f"t{j}" for j in rng.choice(25, size=3, replace=False)] for _ in range(60)]
    for seed in range(10):
        out = gaussian_sparse_histogram(units, plan, secure_rng(seed))
        values = list(out.values())
        assert values == sorted(values, reverse=True)
        shuffled = [units[i] for i in rng.permutation(len(units))]
        assert gaussian_sparse_histogram(shuffled, plan, secure_rng(seed)) == out

"""Auditor figures: parity with jax-privacy 2.0.0, hand-computed cases, validation, verdicts."""

import dataclasses
import math

import numpy as np
import pytest
from jax_privacy.auditing import CanaryScoreAuditor
from scipy import special

from synthgen.audit import auditor as A

ATOL = 1e-6


def _score_sets() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(20230514)
    same = rng.normal(size=400)
    return {
        "shift1_500_500": (rng.normal(1.0, 1.0, 500), rng.normal(0.0, 1.0, 500)),
        "shift2_300_700": (rng.normal(2.0, 1.0, 300), rng.normal(0.0, 1.0, 700)),
        "shift0.5_1000_150": (rng.normal(0.5, 1.0, 1000), rng.normal(0.0, 1.0, 150)),
        "shift4_60_900": (rng.normal(4.0, 1.0, 60), rng.normal(0.0, 1.0, 900)),
        "ties_rounded_400_400": (
            np.round(rng.normal(1.5, 1.0, 400)),
            np.round(rng.normal(0.0, 1.0, 400)),
        ),
        "ties_rounded_0.1_250_600": (
            np.round(rng.normal(0.8, 1.0, 250), 1),
            np.round(rng.normal(0.0, 1.0, 600), 1),
        ),
        "perfect_200_200": (np.arange(200.0) + 200.0, np.arange(200.0)),
        "same_distribution_500_500": (rng.normal(size=500), rng.normal(size=500)),
        "identical_scores": (same, same.copy()),
        "reversed_300_300": (rng.normal(-1.0, 1.0, 300), rng.normal(0.0, 1.0, 300)),
        "tiny_3_5": (np.array([0.2, 1.5, 3.0]), np.array([-1.0, 0.0, 0.2, 1.0, 2.0])),
    }


SETS = _score_sets()


@pytest.fixture(scope="module", params=sorted(SETS))
def scores_and_reference(request):
    ins, outs = SETS[request.param]
    return ins, outs, CanaryScoreAuditor(ins, outs)


def test_roc_hull_matches_reference(scores_and_reference):
    # The Bonferroni factor of both epsilon bounds is the number of hull vertices, so the hull
    # itself is compared. `_tn_counts` / `_fn_counts` are private to jax-privacy; the version
    # is pinned (==2.0.0) in the test extra.
    ins, outs, ref = scores_and_reference
    fpr, tpr = A.roc_points(ins, outs)
    ref_fpr = (1.0 - ref._tn_counts / ref._tn_counts[-1])[::-1]
    ref_tpr = (1.0 - ref._fn_counts / ref._fn_counts[-1])[::-1]
    np.testing.assert_allclose(fpr, ref_fpr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tpr, ref_tpr, rtol=0, atol=1e-12)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)


def test_auroc_matches_reference(scores_and_reference):
    ins, outs, ref = scores_and_reference
    assert A.auroc(ins, outs) == pytest.approx(float(ref.attack_auroc()), abs=ATOL)


@pytest.mark.parametrize("fpr", [0.0, 0.001, 0.01, 0.1, 0.5, 1.0])
def test_tpr_at_fpr_matches_reference(scores_and_reference, fpr):
    ins, outs, ref = scores_and_reference
    assert A.tpr_at_fpr(ins, outs, fpr) == pytest.approx(float(ref.tpr_at_given_fpr(fpr)), abs=ATOL)


@pytest.mark.parametrize(("significance", "delta"), [(0.05, 0.0), (0.05, 1e-5), (0.1, 1e-3)])
def test_epsilon_clopper_pearson_matches_reference(scores_and_reference, significance, delta):
    ins, outs, ref = scores_and_reference
    ours = A.epsilon_clopper_pearson(ins, outs, significance=significance, delta=delta)
    assert ours == pytest.approx(float(ref.epsilon_clopper_pearson(significance, delta)), abs=ATOL)


@pytest.mark.parametrize(("significance", "delta"), [(0.05, 1e-5), (0.05, 1e-4), (0.1, 1e-6)])
def test_epsilon_one_run_matches_reference(scores_and_reference, significance, delta):
    # jax-privacy solves for each threshold's root with brentq(xtol=1e-6), so its value is
    # within 1e-6 of the exact root; ours uses xtol=1e-10. The difference is therefore below
    # 1e-6 (+1e-10) by construction; on 400 random sets (sizes up to 3000) it stayed <= 2.5e-7.
    # All cases here keep 2 m delta <= 1, where the p-value is monotone in epsilon.
    ins, outs, ref = scores_and_reference
    ours = A.epsilon_one_run(ins, outs, significance=significance, delta=delta)
    assert ours == pytest.approx(float(ref.epsilon_one_run(significance, delta)), abs=ATOL)


def test_tiny_example_by_hand():
    # Thresholds from high to low give (fp, tp) = (0,0) (0,1) (0,2) (1,2) (1,3) (2,3) (3,3)
    # (3,4) (4,4); the upper hull keeps (0,0) (0,2) (1,3) (3,4) (4,4).
    ins = [2.5, 4.0, 5.0, 0.5]
    outs = [0.0, 1.0, 2.0, 3.0]
    fpr, tpr = A.roc_points(ins, outs)
    np.testing.assert_array_equal(fpr, [0.0, 0.0, 0.25, 0.75, 1.0])
    np.testing.assert_array_equal(tpr, [0.0, 0.5, 0.75, 1.0, 1.0])
    assert A.tpr_at_fpr(ins, outs, 0.0) == 0.5
    assert A.tpr_at_fpr(ins, outs, 0.1) == pytest.approx(0.5 + 0.4 * 0.25)
    assert A.tpr_at_fpr(ins, outs, 0.5) == pytest.approx(0.875)
    assert A.tpr_at_fpr(ins, outs, 1.0) == 1.0
    # Trapezoids 0.15625 + 0.4375 + 0.25; the plain Mann-Whitney AUC would be 12/16.
    assert A.auroc(ins, outs) == pytest.approx(0.84375)


@pytest.mark.parametrize("n", [200, 1000])
def test_perfect_separation_closed_forms(n):
    ins, outs = np.arange(n) + float(n), np.arange(float(n))
    assert A.auroc(ins, outs) == 1.0
    assert A.tpr_at_fpr(ins, outs, 0.01) == 1.0
    # Hull: (0,0), (0,1), (1,1): 3 thresholds. At the middle one all n guesses are right.
    # One-run, delta = 0: the p-value is q^n with q = expit(eps); solve q^n = 0.05 / 3.
    expected_one_run = special.logit((0.05 / 3) ** (1 / n))
    assert A.epsilon_one_run(ins, outs, delta=0.0) == pytest.approx(expected_one_run, abs=1e-9)
    # Clopper-Pearson with 0 of n failures: both one-sided bounds at level a = 0.05 / (2 * 3)
    # are 1 - a^(1/n), so TPR_lo = a^(1/n) and FPR_hi = 1 - a^(1/n).
    root = (0.05 / 6) ** (1 / n)
    expected_cp = math.log(root) - math.log1p(-root)
    assert A.epsilon_clopper_pearson(ins, outs) == pytest.approx(expected_cp, abs=1e-9)


def test_perfect_separation_bounds_grow_with_canaries():
    bounds = []
    for n in (50, 200, 1000):
        ins, outs = np.arange(n) + float(n), np.arange(float(n))
        one_run = A.epsilon_one_run(ins, outs, delta=1e-5)
        cp = A.epsilon_clopper_pearson(ins, outs, delta=1e-5)
        assert one_run > 0 and cp > 0
        bounds.append((one_run, cp))
    assert bounds[0][0] < bounds[1][0] < bounds[2][0]
    assert bounds[0][1] < bounds[1][1] < bounds[2][1]


def test_identical_scores_give_chance_and_zero_bounds():
    scores = np.random.default_rng(3).normal(size=300)
    assert A.auroc(scores, scores) == pytest.approx(0.5)
    fpr, tpr = A.roc_points(scores, scores)
    np.testing.assert_array_equal(fpr, [0.0, 1.0])
    np.testing.assert_array_equal(tpr, [0.0, 1.0])
    assert A.tpr_at_fpr(scores, scores, 0.01) == pytest.approx(0.01)
    assert A.epsilon_one_run(scores, scores, delta=1e-5) == 0.0
    assert A.epsilon_clopper_pearson(scores, scores) == 0.0


def test_delta_lowers_the_bounds():
    ins, outs = SETS["shift2_300_700"]
    assert A.epsilon_one_run(ins, outs, delta=1e-4) < A.epsilon_one_run(ins, outs, delta=0.0)
    assert A.epsilon_clopper_pearson(ins, outs, delta=0.05) < A.epsilon_clopper_pearson(ins, outs)


BAD_SCORES = [
    ([], [1.0]),
    ([1.0], []),
    ([1.0, np.nan], [0.0]),
    ([1.0], [0.0, np.inf]),
    ([[1.0, 2.0]], [0.0]),
]


@pytest.mark.parametrize(("ins", "outs"), BAD_SCORES)
@pytest.mark.parametrize(
    "fn",
    [
        A.roc_points,
        A.auroc,
        A.tpr_at_fpr,
        A.epsilon_clopper_pearson,
        lambda i, o: A.epsilon_one_run(i, o, delta=1e-5),
        lambda i, o: A.audit(i, o, claimed_epsilon=1.0, delta=1e-5),
    ],
)
def test_bad_scores_raise(fn, ins, outs):
    with pytest.raises(ValueError, match="_scores must be"):
        fn(ins, outs)


def test_bad_parameters_raise():
    ins, outs = [1.0, 2.0], [0.0, 0.5]
    with pytest.raises(ValueError, match="fpr="):
        A.tpr_at_fpr(ins, outs, 1.5)
    for significance in (0.0, 1.0):
        with pytest.raises(ValueError, match="significance="):
            A.epsilon_clopper_pearson(ins, outs, significance=significance)
        with pytest.raises(ValueError, match="significance="):
            A.epsilon_one_run(ins, outs, significance=significance, delta=1e-5)
    for delta in (-1e-9, 1.0):
        with pytest.raises(ValueError, match="delta="):
            A.epsilon_one_run(ins, outs, delta=delta)
        with pytest.raises(ValueError, match="delta="):
            A.epsilon_clopper_pearson(ins, outs, delta=delta)
    for claimed in (-1.0, math.nan):
        with pytest.raises(ValueError, match="claimed_epsilon="):
            A.audit(ins, outs, claimed_epsilon=claimed, delta=1e-5)


def test_audit_collects_the_figures():
    ins, outs = SETS["shift2_300_700"]
    result = A.audit(ins, outs, claimed_epsilon=8.0, delta=1e-5)
    assert (result.num_in, result.num_out) == (300, 700)
    assert result.auroc == A.auroc(ins, outs)
    assert result.tpr_at_1pct_fpr == A.tpr_at_fpr(ins, outs, 0.01)
    assert result.epsilon_one_run == A.epsilon_one_run(ins, outs, delta=1e-5)
    assert result.epsilon_clopper_pearson == A.epsilon_clopper_pearson(ins, outs, delta=1e-5)
    assert result.epsilon_lower_bound < 8.0
    assert not result.violation
    assert A.violation_message(result) is None
    as_dict = result.to_dict()
    assert as_dict["violation"] is False
    assert as_dict["claimed_epsilon"] == 8.0 and as_dict["num_in"] == 300
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.claimed_epsilon = 0.1  # type: ignore[misc]


def test_violation_when_bound_exceeds_claim():
    ins, outs = SETS["perfect_200_200"]
    result = A.audit(ins, outs, claimed_epsilon=1.0, delta=1e-5)
    assert result.epsilon_one_run > 1.0
    assert result.violation and result.to_dict()["violation"] is True
    message = A.violation_message(result)
    assert message is not None and "\n" not in message
    assert message.startswith(
        f"PRIVACY VIOLATION: empirical epsilon lower bound {result.epsilon_lower_bound:.4g} > "
        "claimed epsilon 1 "
    )
    assert "95% confidence" in message and "200 in / 200 out" in message


def test_no_violation_for_infinite_claim():
    ins, outs = SETS["perfect_200_200"]
    result = A.audit(ins, outs, claimed_epsilon=math.inf, delta=1e-5)
    assert result.epsilon_lower_bound > 3.0
    assert not result.violation
    assert A.violation_message(result) is None
    assert result.to_dict()["claimed_epsilon"] == math.inf


def test_violation_is_strict():
    result = A.AuditResult(
        num_in=10,
        num_out=10,
        auroc=0.9,
        tpr_at_1pct_fpr=0.5,
        epsilon_one_run=1.0,
        epsilon_clopper_pearson=0.5,
        claimed_epsilon=1.0,
        delta=1e-5,
        significance=0.05,
    )
    assert not result.violation
    assert dataclasses.replace(result, epsilon_one_run=1.01).violation
    # the Clopper-Pearson bound (canaries as separate runs) is information only
    assert not dataclasses.replace(result, epsilon_clopper_pearson=5.0).violation

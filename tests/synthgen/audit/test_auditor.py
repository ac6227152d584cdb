"""The auditor adapter: jax-privacy computes the figures; validation, ROC points, verdicts."""

import dataclasses
import math
import types

import jax_privacy.auditing
import numpy as np
import pytest
from jax_privacy.auditing import CanaryScoreAuditor
from scipy import special

from synthgen.audit import auditor as A


def _score_sets() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(20230514)
    same = rng.normal(size=400)
    return {
        "shift2_300_700": (rng.normal(2.0, 1.0, 300), rng.normal(0.0, 1.0, 700)),
        "ties_rounded_0.1_250_600": (
            np.round(rng.normal(0.8, 1.0, 250), 1),
            np.round(rng.normal(0.0, 1.0, 600), 1),
        ),
        "perfect_200_200": (np.arange(200.0) + 200.0, np.arange(200.0)),
        "identical_scores": (same, same.copy()),
        "reversed_300_300": (rng.normal(-1.0, 1.0, 300), rng.normal(0.0, 1.0, 300)),
        "tiny_3_5": (np.array([0.2, 1.5, 3.0]), np.array([-1.0, 0.0, 0.2, 1.0, 2.0])),
    }


SETS = _score_sets()
# The project's own copies of the statistics, removed in favour of the library (issue 63).
RESTATED = (
    "_RocHull",
    "_roc_hull",
    "_clopper_pearson_upper",
    "_one_run_p_value",
    "_one_run_bound_at",
    "auroc",
    "tpr_at_fpr",
    "epsilon_one_run",
    "epsilon_clopper_pearson",
)


def test_module_restates_no_statistic():
    assert [name for name in RESTATED if hasattr(A, name)] == []
    modules = [v.__name__ for v in vars(A).values() if isinstance(v, types.ModuleType)]
    assert not [name for name in modules if name.split(".")[0] == "scipy"], modules


def test_every_figure_comes_from_jax_privacy(monkeypatch):
    calls = []

    class Spy(CanaryScoreAuditor):
        def __init__(self, ins, outs):
            calls.append("__init__")
            super().__init__(ins, outs)

        def attack_auroc(self, **kwargs):
            calls.append("attack_auroc")
            return 0.25  # a value no real hull gives: the result must be the library's

        def tpr_at_given_fpr(self, fpr, **kwargs):
            calls.append("tpr_at_given_fpr")
            return np.full(np.shape(fpr), 0.125)

        def epsilon_one_run(self, significance, delta, one_sided=True, **kwargs):
            calls.append(("epsilon_one_run", significance, delta))
            return 7.5

        def epsilon_clopper_pearson(self, significance, delta=0, one_sided=True, **kwargs):
            calls.append(("epsilon_clopper_pearson", significance, delta))
            return 6.5

    monkeypatch.setattr(jax_privacy.auditing, "CanaryScoreAuditor", Spy)
    ins, outs = SETS["shift2_300_700"]
    result = A.audit(ins, outs, claimed_epsilon=8.0, delta=1e-5, significance=0.1)
    assert (result.auroc, result.tpr_at_1pct_fpr) == (0.25, 0.125)
    assert (result.epsilon_one_run, result.epsilon_clopper_pearson) == (7.5, 6.5)
    assert calls == [
        "__init__",
        "attack_auroc",
        "tpr_at_given_fpr",
        ("epsilon_one_run", 0.1, 1e-5),
        ("epsilon_clopper_pearson", 0.1, 1e-5),
    ]
    calls.clear()
    fpr, tpr = A.roc_points(ins, outs)
    assert calls == ["__init__", "tpr_at_given_fpr"]
    np.testing.assert_array_equal(tpr[1:], 0.125)
    assert isinstance(A.canary_auditor(ins, outs), Spy)


@pytest.mark.parametrize("name", sorted(SETS))
def test_audit_reports_the_library_figures(name):
    ins, outs = SETS[name]
    ref = CanaryScoreAuditor(ins, outs)
    result = A.audit(ins, outs, claimed_epsilon=1.0, delta=1e-5)
    assert result.auroc == float(ref.attack_auroc())
    assert result.tpr_at_1pct_fpr == float(ref.tpr_at_given_fpr(0.01))
    assert result.epsilon_one_run == float(ref.epsilon_one_run(0.05, 1e-5))
    assert result.epsilon_clopper_pearson == float(ref.epsilon_clopper_pearson(0.05, 1e-5))
    assert (result.num_in, result.num_out) == (len(ins), len(outs))


@pytest.mark.parametrize("name", sorted(SETS))
def test_roc_points_are_the_library_hull(name):
    ins, outs = SETS[name]
    fpr, tpr = A.roc_points(ins, outs)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= -1e-12)
    # Every achievable FPR k / n is a point, so every hull vertex is one.
    np.testing.assert_allclose(np.unique(fpr), np.arange(len(outs) + 1) / len(outs), atol=1e-15)
    ref = CanaryScoreAuditor(ins, outs)
    np.testing.assert_allclose(tpr[fpr > 0], ref.tpr_at_given_fpr(fpr[fpr > 0]), atol=1e-15)
    # The area under the points is the library's AUROC (the curve is its hull).
    area = 0.5 * np.dot(tpr[1:] + tpr[:-1], np.diff(fpr))
    assert area == pytest.approx(float(ref.attack_auroc()), abs=1e-12)


def test_tiny_example_by_hand():
    # Thresholds from high to low give (fp, tp) = (0,0) (0,1) (0,2) (1,2) (1,3) (2,3) (3,3)
    # (3,4) (4,4); the upper hull has the vertices (0,0) (0,2) (1,3) (3,4) (4,4), and the
    # point at fp = 2 lies halfway between (1,3) and (3,4).
    ins = [2.5, 4.0, 5.0, 0.5]
    outs = [0.0, 1.0, 2.0, 3.0]
    fpr, tpr = A.roc_points(ins, outs)
    np.testing.assert_array_equal(fpr, [0.0, 0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(tpr, [0.0, 0.5, 0.75, 0.875, 1.0, 1.0])
    result = A.audit(ins, outs, claimed_epsilon=1.0, delta=1e-5)
    assert result.tpr_at_1pct_fpr == pytest.approx(0.5 + 0.04 * 0.25)
    # Trapezoids 0.15625 + 0.4375 + 0.25; the plain Mann-Whitney AUC would be 12/16.
    assert result.auroc == pytest.approx(0.84375)


@pytest.mark.parametrize("n", [200, 1000])
def test_perfect_separation_closed_forms(n):
    ins, outs = np.arange(n) + float(n), np.arange(float(n))
    result = A.audit(ins, outs, claimed_epsilon=1.0, delta=0.0)
    assert (result.auroc, result.tpr_at_1pct_fpr) == (1.0, 1.0)
    # Hull: (0,0), (0,1), (1,1): 3 thresholds. At the middle one all n guesses are right.
    # One-run, delta = 0 (a pure-DP claim, tested at the smallest positive delta): the
    # p-value is q^n with q = expit(eps); solve q^n = 0.05 / 3. The library's root
    # tolerance is 1e-6.
    expected_one_run = special.logit((0.05 / 3) ** (1 / n))
    assert result.epsilon_one_run == pytest.approx(expected_one_run, abs=1e-6)
    # Clopper-Pearson with 0 of n failures: both one-sided bounds at level a = 0.05 / (2 * 3)
    # are 1 - a^(1/n), so TPR_lo = a^(1/n) and FPR_hi = 1 - a^(1/n).
    root = (0.05 / 6) ** (1 / n)
    expected_cp = math.log(root) - math.log1p(-root)
    assert result.epsilon_clopper_pearson == pytest.approx(expected_cp, abs=1e-9)


def test_pure_dp_claim_is_the_limit_of_small_delta():
    ins, outs = SETS["shift2_300_700"]
    bounds = [
        A.audit(ins, outs, claimed_epsilon=1.0, delta=d).epsilon_one_run
        for d in (0.0, 1e-300, 1e-4)
    ]
    assert bounds[0] == pytest.approx(bounds[1], abs=1e-12)
    assert bounds[2] < bounds[0]  # the delta term lowers the bound


def test_identical_scores_give_chance_and_zero_bounds():
    scores = np.random.default_rng(3).normal(size=300)
    result = A.audit(scores, scores, claimed_epsilon=1.0, delta=1e-5)
    assert result.auroc == pytest.approx(0.5)
    assert result.tpr_at_1pct_fpr == pytest.approx(0.01)
    assert result.epsilon_one_run == 0.0 and result.epsilon_clopper_pearson == 0.0
    fpr, tpr = A.roc_points(scores, scores)
    np.testing.assert_allclose(tpr, fpr, atol=1e-15)


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
        A.canary_auditor,
        A.roc_points,
        lambda i, o: A.audit(i, o, claimed_epsilon=1.0, delta=1e-5),
    ],
)
def test_bad_scores_raise(fn, ins, outs):
    with pytest.raises(ValueError, match="_scores must be"):
        fn(ins, outs)


def test_errors_do_not_echo_scores():
    with pytest.raises(ValueError) as error:
        A.audit([123.456, np.nan], [0.0], claimed_epsilon=1.0, delta=1e-5)
    assert "123" not in str(error.value) and "nan" not in str(error.value).lower()


def test_bad_parameters_raise():
    ins, outs = [1.0, 2.0], [0.0, 0.5]
    for significance in (0.0, 0.5):
        with pytest.raises(ValueError, match="significance="):
            A.audit(ins, outs, claimed_epsilon=1.0, delta=1e-5, significance=significance)
    for delta in (-1e-9, 1.0):
        with pytest.raises(ValueError, match="delta="):
            A.audit(ins, outs, claimed_epsilon=1.0, delta=delta)
    for claimed in (-1.0, math.nan):
        with pytest.raises(ValueError, match="claimed_epsilon="):
            A.audit(ins, outs, claimed_epsilon=claimed, delta=1e-5)


def test_audit_collects_the_figures():
    ins, outs = SETS["shift2_300_700"]
    result = A.audit(ins, outs, claimed_epsilon=8.0, delta=1e-5)
    assert (result.num_in, result.num_out) == (300, 700)
    assert result.epsilon_lower_bound == max(result.epsilon_one_run, result.epsilon_clopper_pearson)
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
        f"PRIVACY VIOLATION: empirical epsilon lower bound {result.epsilon_one_run:.4g} > "
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

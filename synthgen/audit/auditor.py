"""Membership-inference metrics and empirical epsilon lower bounds from canary scores.

An audit inserts canaries into the training data, trains, and scores every canary under the
trained model (higher score = the attacker guesses "in"). This module turns the scores of the
held-in canaries (`in_scores`) and held-out canaries (`out_scores`) into:

  * the ROC curve of the threshold attack "score >= t means in" and its area (AUROC);
  * the TPR at a fixed low FPR (1% by default), the figure that matters for privacy because
    an attack that is confident on a few canaries leaks even when its AUROC is near 1/2
    (Carlini et al. 2022; Panda et al. 2025);
  * two statistical lower bounds on the epsilon of the training run: Clopper-Pearson
    (Jagielski, Ullman, Oprea 2020) and one-run (Steinke, Nasr, Jagielski 2023).

The ROC curve is the upper convex hull of the empirical ROC points: an attacker may
randomise between two thresholds, so every point on a segment between two thresholds is
achievable. All thresholds that are vertices of the hull are searched, and the
significance is split evenly over them (Bonferroni), so choosing the best threshold after
seeing the scores costs nothing in validity. The definitions match
`jax_privacy.auditing.CanaryScoreAuditor` (jax-privacy 2.0.0, Bonferroni strategy, one-sided)
to within 1e-6; jax-privacy is used only by the tests as the reference.

Null hypothesis. Each bound tests the claim "training is (epsilon, delta)-DP with respect to
adding or removing one canary" and reports the largest epsilon for which the scores reject
that claim at level `significance`. They are LOWER bounds at confidence 1 - significance:
a bound above the claimed epsilon refutes the claim (or the audit's assumptions); a bound
below it proves nothing, since a weak attack gives a weak bound.

Assumptions:
  * One-run bound: valid for a single training run in which each of the m canaries was
    included independently with probability 1/2 before training, and the scores were computed
    without knowledge of that draw. If canaries were chosen in/out any other way (a fixed
    split, the best-looking half) the bound is not valid.
  * Clopper-Pearson bound: treats each canary as an independent Bernoulli trial, which is
    exact when every score comes from its own training run (Jagielski et al. 2020) and a
    common approximation when all canaries share one run; prefer the one-run bound there.
  * Each figure holds at confidence 1 - significance on its own. The verdict
    (`AuditResult.violation`) uses the one-run bound only, so a false alarm has probability at
    most `significance` per audited group; a report of G groups is right everywhere with
    probability at least 1 - G * significance (union bound). The Bonferroni split counts the
    hull's vertices, which depend on the scores (as in jax_privacy).
  * The one-run p-value is monotone in epsilon when 2 * m * delta <= 1 (m canaries). Beyond
    that its delta term (2 m delta times a fraction) keeps it near 1, so the bound is about 0:
    a claim with such a delta cannot be refuted by m canaries.

Privacy:
  The inputs are the scores of canaries, which are not private data; the outputs are
  aggregate figures (rates, areas, epsilons, counts). No function here logs or puts scores in
  error messages.

References:
  Jagielski, Ullman, Oprea 2020, "Auditing Differentially Private Machine Learning: How
  Private is Private SGD?" (NeurIPS).
  Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run" (NeurIPS),
  arXiv:2305.08846.
  Carlini, Chien, Nasr, Song, Terzis, Tramer 2022, "Membership Inference Attacks From First
  Principles" (IEEE S&P).
  Panda, Tang, Nasr, Choquette-Choo, Mittal 2025, "Privacy Auditing of Large Language Models"
  (ICLR), arXiv:2503.06808.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import optimize, special, stats

# Root-finder tolerance for the one-run bound; far below the 1e-6 agreement we promise.
_ROOT_XTOL = 1e-10


@dataclasses.dataclass(frozen=True)
class _RocHull:
    """Vertices of the upper convex hull of the empirical ROC, as integer counts.

    `fp[i]` and `tp[i]` are the false and true positives of the i-th hull threshold, both
    non-decreasing, from (0, 0) (threshold above every score) to (num_out, num_in).
    """

    fp: np.ndarray
    tp: np.ndarray
    num_in: int
    num_out: int

    @property
    def size(self) -> int:
        return int(self.fp.size)


def _as_scores(values: np.typing.ArrayLike, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape={array.shape}")
    if not np.all(np.isfinite(array)):
        # The offending values are not echoed: scores stay out of error messages.
        raise ValueError(f"{name} must be finite, got {int(np.sum(~np.isfinite(array)))} bad")
    return array


def _check_significance(significance: float) -> None:
    if not 0.0 < significance < 1.0:
        raise ValueError(f"significance must be in (0, 1), got {significance=}")


def _check_delta(delta: float) -> None:
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta=}")


def _roc_hull(in_scores: np.typing.ArrayLike, out_scores: np.typing.ArrayLike) -> _RocHull:
    """Validates the scores and returns the hull of the ROC of "score >= t is in"."""
    ins = np.sort(_as_scores(in_scores, "in_scores"))
    outs = np.sort(_as_scores(out_scores, "out_scores"))
    # Thresholds from high to low: +inf (nobody guessed in), then every distinct score.
    thresholds = np.concatenate(([np.inf], np.union1d(ins, outs)[::-1]))
    tp = ins.size - np.searchsorted(ins, thresholds, side="left")
    fp = outs.size - np.searchsorted(outs, thresholds, side="left")

    # Andrew's monotone chain, upper half. The points are sorted by (fp, tp) and distinct;
    # exact integer cross products; collinear points are dropped so only strict vertices stay.
    hull: list[tuple[int, int]] = []
    for x, y in zip(fp.tolist(), tp.tolist()):
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0) < 0:
                break  # right turn: hull[-1] stays a vertex
            hull.pop()
        hull.append((x, y))
    counts = np.array(hull, dtype=np.int64)
    return _RocHull(fp=counts[:, 0], tp=counts[:, 1], num_in=ins.size, num_out=outs.size)


def roc_points(
    in_scores: np.typing.ArrayLike, out_scores: np.typing.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """ROC curve of the attack "score >= t is in", restricted to its upper convex hull.

    Points between two vertices are achieved by randomising between their thresholds, so the
    hull is the ROC of the best threshold attack (the curve to plot).

    Args:
      in_scores: attack scores of the canaries that were included in training.
      out_scores: attack scores of the canaries that were held out.

    Returns:
      `(fpr, tpr)`, two float arrays of equal length, both non-decreasing, from (0, 0) to
      (1, 1).

    Raises:
      ValueError: if either score array is empty, not 1-D or not finite.
    """
    hull = _roc_hull(in_scores, out_scores)
    return hull.fp / hull.num_out, hull.tp / hull.num_in


def auroc(in_scores: np.typing.ArrayLike, out_scores: np.typing.ArrayLike) -> float:
    """Area under the (convex-hull) ROC curve of the threshold attack.

    Equals `CanaryScoreAuditor.attack_auroc()` of jax-privacy 2.0.0. Because of the hull it is
    at least 1/2, and can exceed the plain Mann-Whitney AUC.

    Args:
      in_scores: attack scores of the held-in canaries.
      out_scores: attack scores of the held-out canaries.

    Returns:
      The area, in [0.5, 1].

    Raises:
      ValueError: if either score array is empty, not 1-D or not finite.
    """
    fpr, tpr = roc_points(in_scores, out_scores)
    return float(0.5 * np.dot(tpr[1:] + tpr[:-1], np.diff(fpr)))


def tpr_at_fpr(
    in_scores: np.typing.ArrayLike, out_scores: np.typing.ArrayLike, fpr: float = 0.01
) -> float:
    """Largest true positive rate of a (randomised) threshold attack with the given FPR.

    Reads the hull ROC at `fpr`, interpolating linearly between the two vertices around it.
    Equals `CanaryScoreAuditor.tpr_at_given_fpr(fpr)` of jax-privacy 2.0.0.

    Args:
      in_scores: attack scores of the held-in canaries.
      out_scores: attack scores of the held-out canaries.
      fpr: the false positive rate, in [0, 1]. With n held-out canaries, rates below 1/n are
        interpolated towards the point of zero false positives.

    Returns:
      The true positive rate, in [0, 1].

    Raises:
      ValueError: if `fpr` is outside [0, 1] or a score array is empty, not 1-D or not finite.
    """
    if not 0.0 <= fpr <= 1.0:
        raise ValueError(f"fpr must be in [0, 1], got {fpr=}")
    hull = _roc_hull(in_scores, out_scores)
    target = fpr * hull.num_out
    # First vertex with more false positives than the target; the one before it has at most
    # the target. side="right" skips the vertical start (several vertices with fp == 0).
    right = min(int(np.searchsorted(hull.fp, target, side="right")), hull.size - 1)
    left = right - 1
    weight = (target - hull.fp[left]) / (hull.fp[right] - hull.fp[left])
    tp = hull.tp[left] + weight * (hull.tp[right] - hull.tp[left])
    return float(tp / hull.num_in)


def _clopper_pearson_upper(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper confidence bounds (level 1 - alpha) on a rate."""
    successes = np.asarray(successes)
    upper = np.ones(successes.shape, dtype=np.float64)
    below = successes < trials
    k = successes[below]
    upper[below] = stats.beta.ppf(1.0 - alpha, k + 1, trials - k)
    return upper


def epsilon_clopper_pearson(
    in_scores: np.typing.ArrayLike,
    out_scores: np.typing.ArrayLike,
    *,
    significance: float = 0.05,
    delta: float = 0.0,
) -> float:
    """Epsilon lower bound from Clopper-Pearson intervals on TPR and FPR.

    An (epsilon, delta)-DP training run forces every attack to satisfy
    TPR <= exp(epsilon) * FPR + delta. At each hull threshold, the one-sided Clopper-Pearson
    lower bound on the TPR and upper bound on the FPR (each at level significance / (2 H),
    H = number of hull thresholds: a union bound over the two rates and Bonferroni over the
    thresholds) give epsilon >= log((TPR_lo - delta) / FPR_hi). The largest value, or 0, is
    returned. Equals `CanaryScoreAuditor.epsilon_clopper_pearson(significance, delta)` of
    jax-privacy 2.0.0 (one-sided, Bonferroni).

    Args:
      in_scores: attack scores of the held-in canaries.
      out_scores: attack scores of the held-out canaries.
      significance: allowed probability that the bound is wrong (1 - confidence).
      delta: the delta of the (epsilon, delta) claim being tested.

    Returns:
      An epsilon lower bound >= 0, valid at confidence 1 - significance when the canaries are
      independent trials (see the module docstring).

    Raises:
      ValueError: on bad `significance`, `delta` or scores.

    References:
      Jagielski, Ullman, Oprea 2020, "Auditing Differentially Private Machine Learning".
    """
    _check_significance(significance)
    _check_delta(delta)
    hull = _roc_hull(in_scores, out_scores)
    alpha = significance / (2 * hull.size)
    tpr_lower = 1.0 - _clopper_pearson_upper(hull.num_in - hull.tp, hull.num_in, alpha)
    fpr_upper = _clopper_pearson_upper(hull.fp, hull.num_out, alpha)  # always > 0
    usable = tpr_lower > delta
    if not np.any(usable):
        return 0.0
    bounds = np.log(tpr_lower[usable] - delta) - np.log(fpr_upper[usable])
    return max(0.0, float(np.max(bounds)))


def _one_run_p_value(
    num_canaries: int, num_guesses: int, num_correct: int, epsilon: float, delta: float
) -> float:
    """P-value of "num_correct of num_guesses right" under an (epsilon, delta)-DP null.

    Steinke et al. 2023 (Theorem 3.1 and its delta extension): under the null, the number of
    correct guesses is stochastically dominated by Binomial(num_guesses, e^eps / (1 + e^eps)),
    up to an additive term 2 m delta * max_i P(v - i <= X < v) / i with v = num_correct.
    """
    q = special.expit(epsilon)
    p_value = stats.binom.sf(num_correct - 1, num_guesses, q)
    if delta == 0.0 or num_correct == 0:
        return float(p_value)
    # window[i - 1] = P(v - i <= X <= v - 1) for i = 1..v.
    window = np.cumsum(stats.binom.pmf(np.arange(num_correct - 1, -1, -1), num_guesses, q))
    delta_weight = np.max(window / np.arange(1, num_correct + 1))
    return float(min(1.0, p_value + 2.0 * num_canaries * delta * delta_weight))


def _one_run_bound_at(
    num_canaries: int,
    num_guesses: int,
    num_correct: int,
    alpha: float,
    delta: float,
    floor: float,
) -> float:
    """Largest epsilon >= floor that one threshold's guesses reject, or floor if none."""

    def margin(epsilon: float) -> float:  # > 0 where (epsilon, delta) is rejected
        return alpha - _one_run_p_value(num_canaries, num_guesses, num_correct, epsilon, delta)

    # The delta term only raises the p-value: cheap exit before computing it.
    if _one_run_p_value(num_canaries, num_guesses, num_correct, floor, 0.0) > alpha:
        return floor
    if margin(floor) <= 0:
        return floor
    low, high = floor, max(1.0, 2.0 * floor)
    while margin(high) > 0:
        low, high = high, 2.0 * high
    # The p-value increases with epsilon (for 2 m delta <= 1), so the root is the answer.
    return float(optimize.brentq(margin, low, high, xtol=_ROOT_XTOL))


def epsilon_one_run(
    in_scores: np.typing.ArrayLike,
    out_scores: np.typing.ArrayLike,
    *,
    significance: float = 0.05,
    delta: float,
) -> float:
    """Epsilon lower bound from a single training run (Steinke, Nasr, Jagielski 2023).

    With m = len(in_scores) + len(out_scores) canaries, each included independently with
    probability 1/2, the attacker at threshold t guesses "in" for every canary scoring >= t
    and abstains on the rest. Under (epsilon, delta)-DP the number of correct guesses is at
    most Binomial(guesses, e^eps / (1 + e^eps)) plus a delta term; the bound at t is the
    largest epsilon whose p-value is <= significance / H (Bonferroni over the H hull
    thresholds), and the largest bound over the thresholds is returned (0 if none rejects).
    Equals `CanaryScoreAuditor.epsilon_one_run(significance, delta)` of jax-privacy 2.0.0
    (one-sided, Bonferroni) up to that library's root tolerance of 1e-6.

    Args:
      in_scores: attack scores of the canaries drawn "in" (included in training).
      out_scores: attack scores of the canaries drawn "out".
      significance: allowed probability that the bound is wrong (1 - confidence).
      delta: the delta of the (epsilon, delta) claim being tested; 0 tests pure DP. The
        p-value is monotone in epsilon (so the bound is well defined) when 2 m delta <= 1.

    Returns:
      An epsilon lower bound >= 0, valid at confidence 1 - significance under the one-run
      assumptions in the module docstring.

    Raises:
      ValueError: on bad `significance`, `delta` or scores.

    References:
      Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run",
      arXiv:2305.08846.
    """
    _check_significance(significance)
    _check_delta(delta)
    hull = _roc_hull(in_scores, out_scores)
    num_canaries = hull.num_in + hull.num_out
    alpha = significance / hull.size
    guesses = hull.tp + hull.fp
    precision = np.divide(hull.tp, guesses, out=np.zeros(hull.size), where=guesses > 0)

    best = 0.0
    # Most precise thresholds first, so later ones are usually skipped without a search.
    for i in np.argsort(-precision, kind="stable"):
        # With precision <= e^best / (1 + e^best) the p-value at `best` is >= 1/2 > alpha
        # (the binomial median is >= floor of its mean), so this threshold cannot do better.
        if guesses[i] == 0 or precision[i] <= special.expit(best):
            continue
        best = _one_run_bound_at(num_canaries, int(guesses[i]), int(hull.tp[i]), alpha, delta, best)
    return best


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Aggregate figures of one membership audit against a claimed (epsilon, delta).

    Attributes:
      num_in: number of held-in canaries.
      num_out: number of held-out canaries.
      auroc: area under the convex-hull ROC of the threshold attack.
      tpr_at_1pct_fpr: TPR of the best (randomised) threshold attack at 1% FPR.
      epsilon_one_run: one-run lower bound (Steinke et al. 2023) at `delta`.
      epsilon_clopper_pearson: Clopper-Pearson lower bound (Jagielski et al. 2020) at `delta`.
      claimed_epsilon: the epsilon the training run claims; `math.inf` for a non-private run.
      delta: the delta of the claim, used by both bounds.
      significance: the level of each bound (confidence 1 - significance).
    """

    num_in: int
    num_out: int
    auroc: float
    tpr_at_1pct_fpr: float
    epsilon_one_run: float
    epsilon_clopper_pearson: float
    claimed_epsilon: float
    delta: float
    significance: float

    def __post_init__(self) -> None:
        if self.num_in < 1 or self.num_out < 1:
            raise ValueError(f"need canaries on both sides, got {self.num_in=}, {self.num_out=}")
        if math.isnan(self.claimed_epsilon) or self.claimed_epsilon < 0:
            raise ValueError(f"claimed_epsilon must be >= 0 or inf, got {self.claimed_epsilon=}")
        _check_delta(self.delta)
        _check_significance(self.significance)

    @property
    def epsilon_lower_bound(self) -> float:
        """The larger of the two empirical epsilon lower bounds."""
        return max(self.epsilon_one_run, self.epsilon_clopper_pearson)

    @property
    def violation(self) -> bool:
        """Whether the one-run lower bound exceeds the claimed epsilon (never for inf).

        Only the one-run bound decides: it is valid for canaries that share one training
        run (each inserted independently with probability 1/2). The Clopper-Pearson bound
        treats canaries as independent runs, an approximation here; it is reported for
        information only.
        """
        return math.isfinite(self.claimed_epsilon) and (self.epsilon_one_run > self.claimed_epsilon)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python fields plus `epsilon_lower_bound` and `violation`.

        A non-private claim stays `math.inf`; `json.dumps` writes it as `Infinity`.
        """
        return {
            **dataclasses.asdict(self),
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "violation": self.violation,
        }


def audit(
    in_scores: np.typing.ArrayLike,
    out_scores: np.typing.ArrayLike,
    *,
    claimed_epsilon: float,
    delta: float,
    significance: float = 0.05,
) -> AuditResult:
    """Computes every membership figure and both epsilon lower bounds for one claim.

    Args:
      in_scores: attack scores of the held-in canaries (higher = more likely "in").
      out_scores: attack scores of the held-out canaries.
      claimed_epsilon: the epsilon the training run claims, >= 0; `math.inf` if it is not
        private (the figures are still computed, `violation` is never raised).
      delta: the delta of the claim, in [0, 1).
      significance: the level of each bound.

    Returns:
      The `AuditResult`.

    Raises:
      ValueError: on bad scores, `claimed_epsilon`, `delta` or `significance`.

    Privacy:
      Reads canary scores only (not private data) and returns aggregate figures.
    """
    claimed_epsilon = float(claimed_epsilon)
    if math.isnan(claimed_epsilon) or claimed_epsilon < 0:
        raise ValueError(f"claimed_epsilon must be >= 0 or inf, got {claimed_epsilon=}")
    _check_significance(significance)
    _check_delta(delta)
    ins = _as_scores(in_scores, "in_scores")
    outs = _as_scores(out_scores, "out_scores")
    return AuditResult(
        num_in=int(ins.size),
        num_out=int(outs.size),
        auroc=auroc(ins, outs),
        tpr_at_1pct_fpr=tpr_at_fpr(ins, outs, 0.01),
        epsilon_one_run=epsilon_one_run(ins, outs, significance=significance, delta=delta),
        epsilon_clopper_pearson=epsilon_clopper_pearson(
            ins, outs, significance=significance, delta=delta
        ),
        claimed_epsilon=claimed_epsilon,
        delta=float(delta),
        significance=float(significance),
    )


def violation_message(result: AuditResult) -> str | None:
    """One loud line when the audit refutes the claimed epsilon, else None.

    Args:
      result: an audit result.

    Returns:
      "PRIVACY VIOLATION: ..." naming the bound, the claim, the confidence and the canary
      counts, or None if no bound exceeds the claim.
    """
    if not result.violation:
        return None
    confidence = 100.0 * (1.0 - result.significance)
    return (
        f"PRIVACY VIOLATION: empirical epsilon lower bound {result.epsilon_one_run:.4g} > "
        f"claimed epsilon {result.claimed_epsilon:.4g} (one-run bound at delta="
        f"{result.delta:.3g}, {confidence:.4g}% confidence, {result.num_in} in / "
        f"{result.num_out} out canaries): the run leaks more than it claims, or the audit's "
        "assumptions (independent 1/2 inclusion of canaries) do not hold."
    )

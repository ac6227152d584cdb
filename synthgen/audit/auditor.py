"""Membership figures and epsilon lower bounds from canary scores, by jax-privacy's auditor.

A thin adapter over `jax_privacy.auditing.CanaryScoreAuditor` (jax-privacy 2.0.0, pinned in
pyproject.toml; its default Bonferroni threshold strategy, one-sided), which computes every
statistic: the ROC hull, AUROC, TPR at 1% FPR, the one-run bound (Steinke, Nasr & Jagielski
2023) and the Clopper-Pearson bound (Jagielski, Ullman & Oprea 2020). The project adds what
the library lacks: `canary_auditor` refuses non-finite scores (never echoing them),
`roc_points` reads the hull off `tpr_at_given_fpr`, a pure-DP claim is tested at
`_PURE_DP_DELTA`, and `audit` / `violation_message` give the verdict against a claim (the
one-run bound alone decides). Each bound is a LOWER bound at confidence 1 - significance:
above the claim it refutes the claim (or the audit's assumptions), below it proves
nothing. The null hypothesis and the assumptions of each bound: docs/guides/audits.md
("What the bounds assume").

Privacy:
  The inputs are the scores of canaries, which are not private data; the outputs are
  aggregate figures (rates, areas, epsilons, counts). No function here logs or puts scores in
  error messages.

References: Jagielski, Ullman, Oprea 2020 (NeurIPS); Steinke, Nasr, Jagielski 2023
(NeurIPS, arXiv:2305.08846); Carlini et al. 2022, "Membership Inference Attacks From First
Principles" (IEEE S&P); Panda et al. 2025, "Privacy Auditing of Large Language Models"
(ICLR, arXiv:2503.06808).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from jax_privacy import auditing

from synthgen.audit.canaries import split_by_repetitions
from synthgen.audit.claims import group_claim

TPR_FPR = 0.01  # the FPR of `AuditResult.tpr_at_1pct_fpr`
# The one-run bound of a pure-DP claim (the library needs delta > 0) is computed at this
# delta. Sound: (epsilon, 0)-DP implies (epsilon, delta')-DP for every delta' > 0, so
# rejecting the weaker claim rejects the pure one; its p-value term (2 m delta' times a
# probability, below 1e-300) vanishes in floating point, so the figure is the delta = 0 one.
_PURE_DP_DELTA = math.ulp(0.0)


def _as_scores(values: np.typing.ArrayLike, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape={array.shape}")
    if not np.all(np.isfinite(array)):
        # The offending values are not echoed: scores stay out of error messages.
        raise ValueError(f"{name} must be finite, got {int(np.sum(~np.isfinite(array)))} bad")
    return array


def _check_significance(significance: float) -> None:
    if not 0.0 < significance < 0.5:
        raise ValueError(f"significance must be in (0, 0.5), got {significance=}")


def _check_delta(delta: float) -> None:
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta=}")


def canary_auditor(
    in_scores: np.typing.ArrayLike, out_scores: np.typing.ArrayLike
) -> auditing.CanaryScoreAuditor:
    """jax-privacy's `CanaryScoreAuditor` on validated scores.

    Args:
      in_scores: attack scores of the canaries that were included in training.
      out_scores: attack scores of the canaries that were held out.

    Returns:
      The library's auditor of the attack "score >= t is in"; call its `attack_auroc()`,
      `tpr_at_given_fpr(fpr)`, `epsilon_one_run(significance, delta)` (delta > 0) and
      `epsilon_clopper_pearson(significance, delta)`.

    Raises:
      ValueError: if either score array is empty, not 1-D or not finite.
    """
    ins = _as_scores(in_scores, "in_scores")
    outs = _as_scores(out_scores, "out_scores")
    return auditing.CanaryScoreAuditor(ins, outs)


def roc_points(
    in_scores: np.typing.ArrayLike, out_scores: np.typing.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """ROC curve of the attack "score >= t is in", restricted to its upper convex hull.

    Points between two vertices are achieved by randomising between their thresholds, so the
    hull is the ROC of the best threshold attack (the curve to plot). It is the library's
    `tpr_at_given_fpr` at every FPR k / n (k = 0..n false positives of n held-out canaries),
    which includes every vertex of the hull, preceded by (0, 0) when the curve starts with a
    vertical segment. The scores are `canary_auditor`'s.

    Returns:
      `(fpr, tpr)`, two float arrays of equal length, both non-decreasing, from (0, 0) to
      (1, 1).

    Raises:
      ValueError: if either score array is empty, not 1-D or not finite.
    """
    library = canary_auditor(in_scores, out_scores)
    num_out = np.asarray(out_scores).size
    fpr = np.arange(num_out + 1) / num_out
    tpr = np.asarray(library.tpr_at_given_fpr(fpr), dtype=np.float64)
    if tpr[0] > 0.0:
        fpr, tpr = np.concatenate(([0.0], fpr)), np.concatenate(([0.0], tpr))
    return fpr, tpr


def _epsilon_one_run(
    library: auditing.CanaryScoreAuditor, significance: float, delta: float
) -> float:
    """The library's one-run bound; a pure-DP claim is tested at `_PURE_DP_DELTA`."""
    return float(library.epsilon_one_run(significance, delta if delta > 0 else _PURE_DP_DELTA))


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

    One `CanaryScoreAuditor` computes the AUROC, the TPR at 1% FPR and both bounds.

    Args:
      in_scores: attack scores of the held-in canaries (higher = more likely "in").
      out_scores: attack scores of the held-out canaries.
      claimed_epsilon: the epsilon the training run claims, >= 0; `math.inf` if it is not
        private (the figures are still computed, `violation` is never raised).
      delta: the delta of the claim, in [0, 1).
      significance: the level of each bound, in (0, 0.5).

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
    library = canary_auditor(in_scores, out_scores)
    return AuditResult(
        num_in=int(np.asarray(in_scores).size),
        num_out=int(np.asarray(out_scores).size),
        auroc=float(library.attack_auroc()),
        tpr_at_1pct_fpr=float(library.tpr_at_given_fpr(TPR_FPR)),
        epsilon_one_run=_epsilon_one_run(library, significance, delta),
        epsilon_clopper_pearson=float(library.epsilon_clopper_pearson(significance, delta)),
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


def membership_rows(drawn, scores, epsilon: float, delta: float, figures) -> tuple[list, dict]:
    """Membership rows and ROC points per repetitions group (`canaries.split_by_repetitions`).

    A group of r repetitions is judged against its group claim (`claims.group_claim`);
    `figures(inside, outside, claim_epsilon, claim_delta)` gives the row's figures where
    the group has canaries on both sides.
    """
    rows, rocs = [], {}
    for reps, (inside, outside) in split_by_repetitions(drawn, scores).items():
        claim_eps, claim_delta = group_claim(epsilon, delta, reps)
        row = {"repetitions": reps, "claimed_epsilon": claim_eps, "claimed_delta": claim_delta}
        if inside and outside:
            row.update(figures(inside, outside, claim_eps, claim_delta))
            fpr, tpr = roc_points(inside, outside)
            rocs[reps] = {"fpr": fpr.tolist(), "tpr": tpr.tolist()}
        else:
            row["note"] = "no in/out split in this group (every canary landed on one side)"
        rows.append(row)
    return rows, rocs

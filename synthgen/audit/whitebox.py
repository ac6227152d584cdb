"""White-box audit of the DP-SGD step: canary gradients inserted before the Gaussian noise.

This audits the project's own DP step (`synthgen.dp_train`), not a model's memorisation:
m canaries, each a uniformly random unit direction u_i in the trainable parameters' space
scaled to the clip norm C (one example's largest clipped contribution), are each added with
probability 1/2 to one real batch's clipped gradient sum (`dp_train.make_clipped_grad_sum`);
the sum goes through `dp_train.make_noisy_update` unchanged; each canary is scored by
<u_i, g~> / C, g~ the privatized gradient sum (`noisy_grad`, read from `make_noisy_update`
run with `optax.identity()` on zero parameters), and by -<u_i, update> under Adafactor (a
post-processing: weaker). The claim is `step_plan`: the project's accountant for one step
at sampling rate 1, the Gaussian mechanism with noise multiplier sigma. The statistics are
jax-privacy's (`score_stats`). Why this observable is the most powerful, why one step and
not T: docs/guides/audits.md ("White-box audit of the DP-SGD step").

Privacy:
  The audited step runs on a real batch of private examples. What leaves this module is
  aggregate only (`WhiteboxResult`: counts, rates, areas, epsilons, the noise multiplier);
  the inclusion coins, the keys of the canaries, coins and noise, the per-canary scores and
  the gradients live in memory only and are never written, logged or returned. The
  non-private row (epsilon = inf, no noise) is NOT private: its figures are a function of
  the batch's gradient without noise; a DP row's figures are post-processing of one noisy
  step, (epsilon, delta)-DP for one example of the batch. Nothing is charged to a ledger:
  nothing is released but the aggregates.

References: Steinke, Nasr, Jagielski 2023 (NeurIPS, arXiv:2305.08846); Mahloujifar, Melis,
Chaudhuri 2024 (arXiv:2410.22235); Nasr et al. 2023, "Tight Auditing of Differentially
Private Machine Learning" (USENIX Security: white-box gradient canaries); Abadi et al. 2016.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from synthgen import dp_train, run_seed

PyTree = Any
OBSERVABLES = ("noisy_grad", "adafactor_update")
PRIMARY = "noisy_grad"
TPR_FPR = 0.01


@dataclasses.dataclass(frozen=True)
class WhiteboxConfig:
    """One white-box audit cell: canaries, the claimed epsilon, the step's hyper-parameters.

    Attributes:
      num_canaries: m, the canaries (each included with probability 1/2).
      epsilon: the target epsilon of the audited step; `math.inf` runs the step without
        noise (the explicitly non-private reference, noise multiplier 0).
      delta: the delta of the claim and of both bounds; 2 m delta <= 1 keeps the one-run
        p-value monotone (`synthgen.audit.auditor`).
      clip_norm: C, the clip norm of the real examples and the norm of every canary.
      learning_rate: Adafactor's learning rate (the secondary observable only).
      lora: the Adafactor variant of `dp_train.make_optimizer`.
      microbatch: examples per vmap / ghost-clipping chunk of the real batch.
      significance: level of every bound (confidence 1 - significance).
      chunk: canary directions drawn at once (memory: chunk x parameters floats).
      seed: None (production) draws the 128-bit audit seed from OS entropy; fixed seeds are
        for tests only. The coins, directions and noise come from independent streams of it.
      accountant: the accountant that calibrates and states the claim.
    """

    num_canaries: int = 1000
    epsilon: float = 8.0
    delta: float = 1e-5
    clip_norm: float = 1.0
    learning_rate: float = 2e-3
    lora: bool = False
    microbatch: int = 4
    significance: float = 0.05
    chunk: int = 50
    seed: int | None = None
    accountant: str = "pld"

    def __post_init__(self) -> None:
        if self.num_canaries < 2:
            raise ValueError(f"num_canaries must be >= 2, got {self.num_canaries=}")
        if math.isnan(self.epsilon) or not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0 or inf, got {self.epsilon=}")
        if not 0 < self.delta < 1 or 2 * self.num_canaries * self.delta > 1:
            raise ValueError(
                f"delta must be in (0, 1/(2 m)] for m canaries, got {self.delta=}, "
                f"{self.num_canaries=}"
            )
        if not (self.clip_norm > 0 and self.learning_rate > 0):
            raise ValueError(f"clip_norm and learning_rate must be > 0, got {self.clip_norm=}")
        if self.microbatch < 1 or self.chunk < 1:
            raise ValueError(f"microbatch and chunk must be >= 1, got {self.microbatch=}")
        if not 0 < self.significance < 1:
            raise ValueError(f"significance must be in (0, 1), got {self.significance=}")
        if self.seed is not None:
            run_seed.check_seed(self.seed)


def step_plan(config: WhiteboxConfig, batch_size: int) -> dp_train.PrivacyPlan:
    """The claim for one canary: one DP step in which the canary is present with certainty.

    Args:
      config: the audit cell.
      batch_size: B, the step's (public) expected batch size.

    Returns:
      `dp_train.plan_privacy` of B examples in batches of B (sampling rate 1) for one epoch
      (one step) at `config.delta`: noise multiplier calibrated to `config.epsilon` (0 for
      `math.inf`) and the plan's epsilon, the claim the bounds are compared with.

    Privacy:
      Add/remove one canary (one clipped contribution of norm C): the Gaussian mechanism
      with sensitivity C and noise sigma C, accounted by the project's accountant.
    """
    private = math.isfinite(config.epsilon)
    dp = dp_train.DPConfig(
        batch_size=batch_size,
        epochs=1.0,
        clip_norm=config.clip_norm,
        learning_rate=config.learning_rate,
        noise_multiplier=None if private else 0.0,
        target_epsilon=config.epsilon if private else None,
        delta=config.delta,
        accountant=config.accountant,
        microbatch=1,
        physical_batch=1,
    )
    plan = dp_train.plan_privacy(dp, batch_size)
    if plan.steps != 1 or plan.sampling_rate != 1.0:  # the claim is about exactly this step
        raise RuntimeError(f"one-step plan expected, got {plan.steps=}, {plan.sampling_rate=}")
    return plan


# ---- statistics (jax-privacy at run time) ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScoreStats:
    """The figures of one observable's scores (aggregates only).

    `roc_tpr` is the TPR at each FPR of `ROC_FPR` (the attack "in" above the out-scores'
    quantile); `histogram_edges` / `histogram_in` / `histogram_out` bin the in and out
    scores. Empty for results written before they were recorded.
    """

    observable: str
    auroc: float
    tpr_at_1pct_fpr: float
    epsilon_one_run: float
    epsilon_one_run_fdp: float
    roc_tpr: tuple[float, ...] = ()
    histogram_edges: tuple[float, ...] = ()
    histogram_in: tuple[int, ...] = ()
    histogram_out: tuple[int, ...] = ()


ROC_FPR = tuple(float(f) for f in np.linspace(0.0, 1.0, 101))
HISTOGRAM_BINS = 40


def roc_curve(in_scores: np.ndarray, out_scores: np.ndarray) -> tuple[float, ...]:
    """TPR at each FPR of `ROC_FPR`: the share of in-scores strictly above the score that
    a share FPR of the out-scores exceeds (a step curve, conservative at ties)."""
    in_scores, out_sorted = np.asarray(in_scores), np.sort(np.asarray(out_scores))[::-1]
    tpr = []
    for fpr in ROC_FPR:
        k = int(np.floor(fpr * out_sorted.size + 1e-9))  # out-scores allowed above
        threshold = out_sorted[k] if k < out_sorted.size else -np.inf
        tpr.append(float(np.mean(in_scores > threshold)) if in_scores.size else 0.0)
    return tuple(tpr)


def score_histogram(
    in_scores, out_scores
) -> tuple[tuple[float, ...], tuple[int, ...], tuple[int, ...]]:
    """(edges, in counts, out counts): `HISTOGRAM_BINS` bins over the finite scores' range,
    widened outward to a round step (a tenth of the range's power of ten), so the edges
    do not state the extreme scores exactly; non-finite scores are not binned."""
    in_scores, out_scores = np.asarray(in_scores, np.float64), np.asarray(out_scores, np.float64)
    in_scores, out_scores = in_scores[np.isfinite(in_scores)], out_scores[np.isfinite(out_scores)]
    both = np.concatenate([in_scores, out_scores])
    low, high = (float(both.min()), float(both.max())) if both.size else (0.0, 1.0)
    step = 10.0 ** np.floor(np.log10(high - low if high > low else 1.0)) / 10.0
    low, high = np.floor(low / step) * step, np.ceil(high / step) * step
    edges = np.linspace(low, high if high > low else low + step, HISTOGRAM_BINS + 1)
    counts_in = np.histogram(in_scores, edges)[0]
    counts_out = np.histogram(out_scores, edges)[0]
    return tuple(map(float, edges)), tuple(map(int, counts_in)), tuple(map(int, counts_out))


def score_stats(
    observable: str,
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    *,
    delta: float,
    significance: float = 0.05,
) -> ScoreStats:
    """AUROC, TPR at 1% FPR and both one-run epsilon bounds, by jax-privacy's auditor.

    Args:
      observable: the name of the scores (one of `OBSERVABLES`, or any label).
      in_scores: scores of the included canaries (higher = "in").
      out_scores: scores of the excluded canaries.
      delta: the delta of the claim tested.
      significance: level of each bound.

    Returns:
      The `ScoreStats`: epsilon-count (Steinke et al. 2023) and f-DP (Mahloujifar et al.
      2024) one-run bounds, one-sided, Bonferroni over thresholds.
    """
    from jax_privacy.auditing import CanaryScoreAuditor  # a runtime dependency, lazily

    auditor = CanaryScoreAuditor(np.asarray(in_scores, np.float64), np.asarray(out_scores))
    edges, counts_in, counts_out = score_histogram(in_scores, out_scores)
    return ScoreStats(
        observable=observable,
        auroc=float(auditor.attack_auroc()),
        tpr_at_1pct_fpr=float(auditor.tpr_at_given_fpr(TPR_FPR)),
        epsilon_one_run=float(auditor.epsilon_one_run(significance, delta)),
        epsilon_one_run_fdp=float(auditor.epsilon_one_run_fdp(significance, delta)),
        roc_tpr=roc_curve(in_scores, out_scores),
        histogram_edges=edges,
        histogram_in=counts_in,
        histogram_out=counts_out,
    )


def statistical_cap(
    num_in: int, num_out: int, *, delta: float, significance: float = 0.05
) -> tuple[float, float]:
    """(epsilon-count cap, f-DP cap): the bounds of a perfect attack on these counts.

    No audit with `num_in` included and `num_out` excluded canaries can certify more, however
    much the run leaks; a non-private run should come close to it.
    """
    perfect = score_stats(
        "perfect", np.ones(num_in), np.zeros(num_out), delta=delta, significance=significance
    )
    return perfect.epsilon_one_run, perfect.epsilon_one_run_fdp


def canary_figures(
    scores: dict[str, np.ndarray],
    coins: np.ndarray,
    *,
    target_epsilon: float,
    claimed_epsilon: float,
    delta: float,
    significance: float,
) -> dict[str, Any]:
    """The `CellResult` fields every audit shares, from its m canaries' scores and coins.

    One `ScoreStats` per observable of `scores` (name -> [m] scores, the primary first),
    the counts in and out and the caps of `statistical_cap`. Aggregates only.
    """
    coins = np.asarray(coins, bool)
    num_in, num_out = int(coins.sum()), int((~coins).sum())
    cap_one_run, cap_fdp = statistical_cap(num_in, num_out, delta=delta, significance=significance)
    return dict(
        num_canaries=coins.size,
        num_in=num_in,
        num_out=num_out,
        target_epsilon=target_epsilon,
        claimed_epsilon=claimed_epsilon,
        delta=delta,
        significance=significance,
        cap_one_run=cap_one_run,
        cap_fdp=cap_fdp,
        stats=tuple(
            score_stats(name, s[coins], s[~coins], delta=delta, significance=significance)
            for name, s in scores.items()
        ),
    )


def markdown_table(head: str, rows: Iterable[str]) -> str:
    """A Markdown table of cells' figures: the `head` row (cells separated by " | "), its
    rule, `rows`."""
    return "\n".join([head, "|" + "---|" * head.count(" | ") + "---|", *rows])


# ---- the audited step ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CellResult:
    """The figures every audit cell records (each audit's result adds its own settings):
    what ran (`model`), the m canaries and how many the coins put in, the target and the
    claimed epsilon (math.inf without noise) at `delta`, the most any attack on these
    counts can certify at `significance` (`cap_one_run`, `cap_fdp`), one `ScoreStats` per
    observable (the primary first) and the wall time; and the primary observable, the
    verdict and the JSON round trip. Aggregates only: no coin, secret or score."""

    model: str
    num_canaries: int
    num_in: int
    num_out: int
    target_epsilon: float
    claimed_epsilon: float
    delta: float
    significance: float
    cap_one_run: float
    cap_fdp: float
    stats: tuple[ScoreStats, ...]
    seconds: float
    # The columns of `figure_cells` in the audits' Markdown tables.
    FIGURES = "AUROC | TPR@1%FPR | eps one-run (count) | eps one-run (f-DP) | cap (count / f-DP)"

    @property
    def primary(self) -> ScoreStats:
        return self.stats[0]

    def figure_cells(self, s: ScoreStats) -> str:
        """The `FIGURES` cells of a Markdown row, for the observable `s`."""
        return (
            f"{s.auroc:.3f} | {s.tpr_at_1pct_fpr:.3f} | {s.epsilon_one_run:.2f} | "
            f"{s.epsilon_one_run_fdp:.2f} | {self.cap_one_run:.2f} / {self.cap_fdp:.2f}"
        )

    @property
    def violation(self) -> bool:
        """Whether any bound of any observable exceeds the claim (never without noise)."""
        if not math.isfinite(self.claimed_epsilon):
            return False
        return any(
            max(s.epsilon_one_run, s.epsilon_one_run_fdp) > self.claimed_epsilon for s in self.stats
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["stats"] = [dataclasses.asdict(s) for s in self.stats]
        out["violation"] = self.violation
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["stats"] = tuple(
            ScoreStats(**{k: tuple(v) if isinstance(v, list) else v for k, v in s.items()})
            for s in data["stats"]
        )
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class WhiteboxResult(CellResult):
    """The aggregate figures of one white-box cell (what a report may show).

    `claimed_epsilon` is the plan's epsilon (math.inf without noise); `stats` holds one
    `ScoreStats` per observable, the primary (`PRIMARY`) first.
    """

    num_params: int
    batch_size: int
    clip_norm: float
    noise_multiplier: float


def _streams(seed: int | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(direction key, coin key, noise key): independent streams of the 128-bit audit seed.

    The coins and the noise are secret: 128-bit ``rbg`` keys, as `dp_train`'s noise. The
    directions need not be (the guarantee holds for any fixed set of canaries): a 64-bit
    threefry key, twice as fast on CPU for the m x parameters normals the audit draws twice.
    """
    children = np.random.SeedSequence(run_seed.shared_seed(seed)).spawn(3)
    directions = jax.random.wrap_key_data(
        children[0].generate_state(2, np.uint32), impl="threefry2x32"
    )
    coins, noise = (run_seed.noise_key(c.generate_state(4, np.uint32)) for c in children[1:])
    return directions, coins, noise


def _directions(key: jax.Array, start: jax.Array, chunk: int, dim: int) -> jax.Array:
    """[chunk, dim] unit vectors: the canaries start .. start + chunk - 1.

    One normal draw per chunk, from fold_in(key, start): a canary's direction depends on the
    chunk size, which is fixed for a run (the insertion and the scoring use the same one).
    """
    v = jax.random.normal(jax.random.fold_in(key, start), (chunk, dim), jnp.float32)
    return v / jnp.linalg.norm(v, axis=1, keepdims=True)


def _canary_pass(key: jax.Array, weights: jax.Array, chunk: int, dim: int) -> jax.Array:
    """sum_i weights[i] u_i, drawing the directions `chunk` at a time (weights padded)."""

    @jax.jit
    def add(total, start, w):
        return total + w @ _directions(key, start, chunk, dim)

    total = jnp.zeros((dim,), jnp.float32)
    for start in range(0, weights.shape[0], chunk):
        total = add(total, jnp.int32(start), weights[start : start + chunk])
    return total


def _score_pass(key: jax.Array, observed: jax.Array, num: int, chunk: int, dim: int) -> np.ndarray:
    """[num, k] inner products of u_i with each of the k columns of `observed` [dim, k]."""

    @jax.jit
    def scores(start):
        return _directions(key, start, chunk, dim) @ observed

    rows = [scores(jnp.int32(start)) for start in range(0, num, chunk)]
    return np.asarray(jnp.concatenate(rows))[:num]


def clipped_batch_sum(
    loss_fn: dp_train.LossFn,
    trainable: PyTree,
    frozen: PyTree,
    batch: dict[str, np.ndarray],
    *,
    clip_norm: float,
    microbatch: int,
    tapped_loss_fn: Callable | None = None,
) -> PyTree:
    """The sum of the batch's clipped per-example gradients, by `dp_train`'s own function.

    Args:
      loss_fn: the model's per-example loss (`dp_train.LossFn`).
      trainable, frozen: the model's parameters, as `dp_train.train` takes them.
      batch: arrays with a leading example axis of B rows (B a multiple of `microbatch`).
      clip_norm: C.
      microbatch: examples per chunk of the scan.
      tapped_loss_fn: the tapped loss for ghost clipping (None: vmap).

    Returns:
      The clipped sum, a float32 pytree shaped like `trainable` (private: not DP).

    Privacy:
      Each example contributes at most C (`dp_train.make_clipped_grad_sum`). The sum itself
      is not private; only `audit_dp_step` releases (aggregates of) a noisy version of it.
    """
    size = {len(v) for v in batch.values()}
    if len(size) != 1 or size.pop() % microbatch:
        raise ValueError(f"the batch's arrays need one row count, a multiple of {microbatch=}")
    rows = len(next(iter(batch.values())))
    shaped = {k: np.asarray(v).reshape(-1, microbatch, *v.shape[1:]) for k, v in batch.items()}
    mask = np.ones((rows // microbatch, microbatch), np.float32)
    grad_sum = jax.jit(
        dp_train.make_clipped_grad_sum(loss_fn, clip_norm, tapped_loss_fn=tapped_loss_fn)
    )
    total, _, _ = grad_sum(trainable, frozen, shaped, mask)
    return jax.device_get(total)


def audit_dp_step(
    grad_sum: PyTree,
    trainable: PyTree,
    batch_size: int,
    config: WhiteboxConfig,
    *,
    model: str = "",
    plan: dp_train.PrivacyPlan | None = None,
) -> WhiteboxResult:
    """Inserts the canaries into one DP step, scores them, and audits the claim.

    Args:
      grad_sum: the real batch's clipped sum (`clipped_batch_sum`), shaped like `trainable`.
      trainable: the parameters the step updates (for the Adafactor observable and shapes).
      batch_size: B, the step's expected batch size (the real batch's size).
      config: the cell.
      model: a public label for the report.
      plan: the step's plan; default `step_plan(config, batch_size)`. Its noise multiplier
        drives the noise and its epsilon is the claim (tests plant a defect by lowering the
        one and keeping the other).

    Returns:
      The `WhiteboxResult` (aggregates only).

    Privacy:
      See the module docstring: the coins, keys, scores and gradients stay in memory; the
      result of a DP cell is post-processing of one (epsilon, delta)-DP step w.r.t. one
      example or one canary.
    """
    start_time = time.perf_counter()
    plan = step_plan(config, batch_size) if plan is None else plan
    m, chunk, c = config.num_canaries, min(config.chunk, config.num_canaries), config.clip_norm
    direction_key, coin_key, noise_key = _streams(config.seed)
    coins = jax.random.bernoulli(coin_key, 0.5, (m,))
    num_in = int(jnp.sum(coins))
    if num_in in (0, m):
        raise RuntimeError("every canary fell on one side; draw again (probability 2^(1-m))")

    trainable = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), trainable)
    flat_sum, unravel = ravel_pytree(jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), grad_sum))
    dim = int(flat_sum.size)
    padded = -(-m // chunk) * chunk
    weights = jnp.zeros((padded,), jnp.float32).at[:m].set(c * coins.astype(jnp.float32))
    with_canaries = unravel(flat_sum + _canary_pass(direction_key, weights, chunk, dim))
    del weights

    def released(optimizer, params, grad_sum):
        update = jax.jit(
            dp_train.make_noisy_update(
                optimizer,
                clip_norm=c,
                noise_multiplier=plan.noise_multiplier,
                expected_batch=batch_size,
            )
        )
        new, _ = update(params, optimizer.init(params), grad_sum, noise_key)
        return ravel_pytree(new)[0] - ravel_pytree(params)[0]

    # identity on zero parameters: the output is exactly the privatized gradient g~ / B.
    zeros = jax.tree.map(jnp.zeros_like, trainable)
    noisy_grad = released(optax.identity(), zeros, with_canaries) * (batch_size / c)
    optimizer = dp_train.make_optimizer(config.learning_rate, lora=config.lora)
    adafactor = -released(optimizer, trainable, with_canaries)
    observed = jnp.stack([noisy_grad, adafactor], axis=1)
    del noisy_grad, adafactor, with_canaries
    scores = _score_pass(direction_key, observed, m, chunk, dim)
    figures = canary_figures(
        {name: scores[:, j] for j, name in enumerate(OBSERVABLES)},
        np.asarray(coins),
        target_epsilon=config.epsilon,
        claimed_epsilon=plan.epsilon,
        delta=config.delta,
        significance=config.significance,
    )
    del scores, coins
    return WhiteboxResult(
        model=model,
        num_params=dim,
        batch_size=batch_size,
        clip_norm=c,
        noise_multiplier=plan.noise_multiplier,
        seconds=time.perf_counter() - start_time,
        **figures,
    )

"""Float32 rounding bounds that keep every clipped per-example contribution within C.

A clip factor c_i = min(1, C / N_i) bounds example i's contribution c_i G_i by C only if N_i
is not below ||G_i||. Computed norms carry rounding: a sum of squares is off by a relative
gamma_k, and a ghost norm (a sum of cross terms that cancel, `synthgen.ghost_clipping`) by
gamma_k times (sum_t ||a_t|| ||b_t||)^2, which can exceed the norm itself many times over.
On an accelerator, where float32 products default to TF32 or bf16, the gap was large enough
to fail the project's own equality test (issue 61). This module turns each computed norm
into an upper bound of the norm it approximates, from the lengths of the sums (static,
public shapes), so that the bound holds at whatever precision the device runs, as long as
every product has exact inputs and float32 accumulation (both paths ask for that: HIGHEST
precision on float32 factors, native bfloat16 factors with `preferred_element_type`).

The rounding model (Higham 2002, ch. 3): each float32 operation is exact up to a relative
error u = 2^-24; a sum or dot product of k terms, in ANY order or tree, is off by at most
gamma_k = k u / (1 - k u) times the sum of the terms' magnitudes. So a reduction's bound
depends on its length: reductions here run one axis at a time behind an optimization
barrier, so that XLA cannot merge them into one long reduction whose worst case would be
the product of the lengths. Underflow is left out: it can only matter for gradients far
below any clip norm in use.

Privacy:
  With N_i from `clip_norm_bound`, every kept example's clip factor satisfies
  c_i ||G_i|| <= C for G_i its per-example gradient as the step defines it (a materialised
  array as computed; for a ghost-normed layer, the exact product of its recorded factors),
  including the rounding of the step's own products over that example's tokens. The
  remaining rounding is that of adding different examples' contributions together, which
  every floating-point DP-SGD has. The cost: N_i exceeds the computed norm by a relative
  eta_i (measured: docs/guides/gpu.md), which clips slightly harder; no noise changes.

References: Higham 2002 (Accuracy and Stability of Numerical Algorithms, ch. 3); Mironov
2012 (floating-point attacks on DP); jax_privacy's note that low-precision clipping can
exceed the bound by machine epsilon.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

F32_UNIT = 2.0**-24
"""Unit roundoff of float32 (round to nearest)."""
BF16_UNIT = 2.0**-8
"""Unit roundoff of bfloat16: the error of rounding a float32 value to bfloat16."""


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u) for float32: the bound of a k-term sum's rounding."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k=}")
    ku = k * F32_UNIT
    if ku >= 0.5:
        raise ValueError(f"a sum of {k=} float32 terms has no useful rounding bound")
    return ku / (1.0 - ku)


def split_long_axis(x: jax.Array) -> tuple[jax.Array, int]:
    """x [..., d] as [..., k, d / k], k the largest divisor of d with k^2 <= d, once d passes
    2048 (a vocabulary's width); else (x, 1). A sum over d then rounds over d / k + k terms
    when its two axes are reduced one after the other, not over d."""
    d = x.shape[-1]
    k = 1
    if d > 2048:
        k = max(f for f in range(1, math.isqrt(d) + 1) if d % f == 0)
    return (x if k == 1 else x.reshape(*x.shape[:-1], k, d // k)), k


def staged_sum(x: jax.Array) -> tuple[jax.Array, int]:
    """Sums x [micro, ...] over every axis but the first, one axis at a time.

    Returns:
      (sums [micro], the bound's chain length: the sum of the reduced axes' lengths, a long
      axis split first by `split_long_axis`). Each reduction is fenced by an optimization
      barrier, so the chain is what the code says.
    """
    length = 0
    while x.ndim > 1:
        x, _ = split_long_axis(x)
        length += x.shape[-1]
        x = jax.lax.optimization_barrier(jnp.sum(x, axis=-1))
    return x, length


def clip_norm_bound(
    squares: jax.Array,
    slack: jax.Array,
    positive: jax.Array,
    cross_weight: jax.Array,
    *,
    norm_eps: float,
    sum_eps_positive: float,
    sum_eps_cross: float,
) -> jax.Array:
    """An upper bound N_i of ||G_i|| from its computed squared norm.

    Args:
      squares: [micro] the computed squared norms (sums of squares and ghost cross terms).
      slack: [micro] the bound of the ghost cross terms' rounding: the sum over Gram pairs
        (u, v) of gamma(their dot and reduction lengths) P_u P_v (computed).
      positive: [micro] the part of `squares` that is a sum of squares of materialised
        arrays (computed), R_i.
      cross_weight: [micro] sum over ghost-normed weights of P^2, P = sum_t ||a_t|| ||b_t||
        over the weight's uses (computed).
      norm_eps: relative rounding of the sums of squares and of adding the terms of
        `squares` and `slack` together, against `positive + cross_weight` (a `gamma` of the
        longest such chain).
      sum_eps_positive: relative rounding of the step's sum of a materialised contribution.
      sum_eps_cross: rounding of a ghost-normed layer's summed product against P.

    Returns:
      N [micro] with ||G_i|| <= N_i and ||c G_i as summed|| <= c N_i, for c >= 0.

    Raises:
      ValueError: norm_eps >= 0.1 (sums too long for a useful float32 bound).
    """
    if not 0 <= norm_eps < 0.1:
        raise ValueError(f"norm_eps must be in [0, 0.1), got {norm_eps=}")
    # `slack`, `positive` and `cross_weight` are computed sums of non-negative terms whose
    # chains are within norm_eps's: each is at most (1 + norm_eps)^3 <= 1 + 4 norm_eps times
    # low (norm_eps < 0.1), hence the factors below; (1 + 16 u) covers the handful of
    # roundings of this formula itself (each a relative u on non-negative values).
    grow = 1.0 + 4 * norm_eps
    scale = positive + cross_weight
    norm = jnp.sqrt(jnp.maximum(squares, 0.0) + grow * (slack + norm_eps * scale))
    summed = sum_eps_positive * jnp.sqrt(positive) + sum_eps_cross * jnp.sqrt(cross_weight)
    return (norm + (1.0 + 2 * norm_eps) * summed) * (1.0 + 16 * F32_UNIT)

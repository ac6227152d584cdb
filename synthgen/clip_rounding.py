"""Rounding bounds that keep every clipped per-example contribution within C on any device.

A clip factor min(1, C / N_i) bounds a contribution by C only if N_i >= ||G_i||, but computed
norms round (a ghost norm, whose cross terms cancel, by up to gamma_k (sum_t ||a_t||
||b_t||)^2, many times the norm). This module turns each computed norm into an upper bound,
from the static lengths of its sums. See docs/guides/querygen.md (clipping at the device's
precision) for the model and the measured price. In short (Higham 2002, ch. 3):

* Products name an exact-input algorithm (`exact_einsum`: F32_F32_F32, or BF16_BF16_F32 for
  bfloat16 factors), never the device's default (TF32 on GPUs, bfloat16 on TPUs).
* Each addition errs by a relative u = 2^-23 (twice float32's unit roundoff: tensor cores
  truncate, Fasi et al. 2021), so a k-term sum in any order errs by gamma_k = k u / (1 - k u)
  of its terms' magnitudes; reductions run one axis at a time behind barriers, so k is what
  the code says.
* Element-wise operations count u each; a GPU's approximate float32 division (2 ulp) counts
  twice; underflow below 2^-126 adds `TINY` per operation. `clip_norm_bound`'s margin
  (1 + 32 u) covers its formula's roundings.

Privacy:
  With N_i from `clip_norm_bound`, every kept example satisfies c_i ||G_i|| <= C for G_i its
  gradient as the step defines it (for a ghost-normed layer, the exact product of its
  recorded factors), including the rounding of the step's own products over its tokens.
  What remains is the rounding of adding different examples' contributions, as in every
  floating-point DP-SGD (Mironov 2012): at most 2 gamma_k sum_j ||c_j G_j|| for k additions
  (`synthgen.ghost_clipping.clipped_sum`). The cost is a slightly harder clip (N_i above the
  norm by a relative eta_i); the noise is unchanged (`scripts/bench_clip_bound.py`).

References: Higham 2002 (Accuracy and Stability of Numerical Algorithms, ch. 3); Fasi,
Higham, Mikaitis, Pranesh 2021 (Numerical behavior of NVIDIA tensor cores); Mironov 2012
(On significance of the least significant bits for differential privacy); NVIDIA, CUDA C++
Programming Guide, Mathematical Functions (single-precision x / y: 2 ulp without -prec-div).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

BOUND_UNIT = 2.0**-23
"""The relative error the bounds allow each float32 operation: twice the unit roundoff."""
BF16_UNIT = 2.0**-8
"""Unit roundoff of bfloat16: the error of rounding a float32 value to bfloat16."""
LONG_AXIS = 8192
"""Axes longer than this are summed in two stages. A feed-forward width (3072 in t5-base) is
not: splitting its Gram products made [micro, n, n, 48] temporaries (432 MiB at t5-base,
microbatch 16) for a bound tighter by about gamma(3000) ~ 4e-4."""
TINY = 2.0**-126
"""The absolute error of an operation that underflows (smallest normal float32)."""


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u) (u = `BOUND_UNIT`): the bound of a k-term sum."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k=}")
    ku = k * BOUND_UNIT
    if ku >= 0.05:
        raise ValueError(f"a sum of {k=} float32 terms has no useful rounding bound")
    return ku / (1.0 - ku)


def exact_einsum(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """An einsum with exact products and float32 accumulation, whatever the device's default.

    Two bfloat16 operands run the BF16_BF16_F32 algorithm (the fast units of a bfloat16
    model); anything else is cast to float32 (exactly) and runs F32_F32_F32.
    """
    if x.dtype == y.dtype == jnp.bfloat16:
        algorithm = "BF16_BF16_F32"
    else:
        x, y, algorithm = x.astype(jnp.float32), y.astype(jnp.float32), "F32_F32_F32"
    return jnp.einsum(spec, x, y, precision=algorithm, preferred_element_type=jnp.float32)


def split_long_axis(x: jax.Array) -> tuple[jax.Array, int]:
    """x [..., d] as [..., k, d / k], k the largest divisor of d with k^2 <= d, once d passes
    `LONG_AXIS` (a vocabulary's width); else (x, 1). A sum over d then rounds over d / k + k
    terms when its two axes are reduced one after the other, not over d."""
    d = x.shape[-1]
    k = 1
    if d > LONG_AXIS:
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


def sum_of_squares(arrays: list[jax.Array], micro: int) -> tuple[jax.Array, int, int]:
    """Per-example squared norms of materialised arrays [micro, ...] (float32).

    Returns:
      (the computed sums [micro], the longest rounding chain among them including the
      additions across arrays, the number of entries per example: each square may underflow).
    """
    total, chain, entries = jnp.zeros((micro,), jnp.float32), 0, 0
    for x in arrays:
        part, length = staged_sum(jnp.square(x.astype(jnp.float32)))
        total = total + part
        chain, entries = max(chain, length + 1), entries + math.prod(x.shape[1:])
    return total, chain + len(arrays), entries


def clip_norm_bound(
    squares: jax.Array,
    slack: jax.Array,
    positive: jax.Array,
    cross_weight: jax.Array,
    *,
    norm_eps: float,
    sum_eps_positive: float,
    sum_eps_cross: float,
    sum_tiny: float = 0.0,
) -> jax.Array:
    """An upper bound N_i of ||G_i|| from its computed squared norm.

    Args:
      squares: [micro] the computed squared norms (sums of squares and ghost cross terms).
      slack: [micro] the bound of the ghost cross terms' rounding and underflow, summed over
        their Gram pairs (computed: `synthgen.ghost_clipping`), plus the underflow of the
        squares of materialised arrays (`TINY` per entry).
      positive: [micro] the part of `squares` that is a sum of squares of materialised
        arrays (computed), R_i.
      cross_weight: [micro] sum over ghost-normed weights of P^2, P = sum_t ||a_t|| ||b_t||
        over the weight's uses (computed).
      norm_eps: relative rounding of the sums of squares and of adding the terms of
        `squares` and `slack` together, against `positive + cross_weight` (a `gamma` of the
        longest such chain).
      sum_eps_positive: relative rounding of the step's sum of a materialised contribution.
      sum_eps_cross: rounding of a ghost-normed layer's summed product against P.
      sum_tiny: underflow of the summed products (absolute, Frobenius).

    Returns:
      N [micro] with ||G_i|| <= N_i and ||c G_i as summed|| <= c N_i, for 0 <= c <= 1.

    Raises:
      ValueError: norm_eps >= 0.05 (sums too long for a useful float32 bound).
    """
    if not 0 <= norm_eps < 0.05:
        raise ValueError(f"norm_eps must be in [0, 0.05), got {norm_eps=}")
    # `slack`, `positive` and `cross_weight` are computed sums of non-negative terms whose
    # chains are within norm_eps's: each is at most (1 + norm_eps)^3 <= 1 + 4 norm_eps times
    # low, hence the factors below. (1 + 32 u) covers the roundings of this formula and of
    # the clip factor C / N computed from it, each a relative u on non-negative values. The
    # longest path: the summed term's square root, product and sum, its product by
    # (1 + 2 norm_eps), the two additions of the last line and the product by (1 + 32 u):
    # seven (under the norm's square root, four roundings halved by it, plus the root: three),
    # then C / N, which a GPU may compute within 2 ulp, a relative 2u: nine u of the 32.
    grow = 1.0 + 4 * norm_eps
    scale = positive + cross_weight
    norm = jnp.sqrt(jnp.maximum(squares, 0.0) + grow * (slack + norm_eps * scale))
    summed = sum_eps_positive * jnp.sqrt(positive) + sum_eps_cross * jnp.sqrt(cross_weight)
    return (norm + (1.0 + 2 * norm_eps) * summed + sum_tiny) * (1.0 + 32 * BOUND_UNIT)

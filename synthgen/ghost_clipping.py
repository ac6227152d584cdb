"""Clipped per-example gradient sums without per-example weight gradients (ghost clipping).

Inside one example, a dense product y = x @ W with input x [n, d_in] and output gradient
g = dL/dy [n, d_out] gives W the gradient x^T g. Its squared norm is

    ||x^T g||_F^2 = sum_{t,s} (x_t . x_s) (g_t . g_s)        (the "ghost norm")

which costs n^2 (d_in + d_out) instead of the n d_in d_out of materialising x^T g (Li et al.
2022). Each layer takes the cheaper of the two, by that cost rule (Bu et al. 2023). With every
example's norm, hence its clip factor c_i, known, W's clipped sum is one batched product
sum_i c_i x_i^T g_i over the x_i and g_i of the same backward pass (Book-Keeping, Bu et al.
2023): no second backward pass and no [batch, d_in, d_out] array for ghost layers.

The x and g come from the taps of `synthgen.models.lora.LoraDense`: its products sow their
inputs and add a zero "perturbation" to their outputs, whose gradient is g. A tapped loss
function has the signature of `TappedLossFn`; the model families provide one
(`tapped_loss_fn()`). Trainable parameters that are not the weight of a product tapped exactly
once per example (norm scales, embeddings, position biases, biases, a weight used twice) get
per-example gradients the usual way (`vmap` of `grad`), and their squares join the norm. A
tapped weight is not differentiated by `grad`: a use of it that is not tapped would be missing
from both its norm and its sum (a biased gradient, not a larger sensitivity); every use in
the project's models is tapped (the tests compare with the per-example path).

Privacy:
  The same mechanism as `synthgen.dp_train`'s per-example path: every real example whose
  gradient (tapped inputs and output gradients included) is finite contributes
  min(1, C / N_i) g_i, of L2 norm at most C; any other row contributes exactly 0. The ghost
  identity is exact, and N_i is an upper bound of ||g_i|| that covers float32 rounding
  (`synthgen.clip_rounding`): every product has exact inputs (`_dot`), so the bound holds at
  any device precision (tested against a float64 recomputation). The clipped sum equals
  the per-example path's to float rounding (tested) and its sensitivity stays C. Shapes,
  the per-layer choice and the rounding bound depend on public shapes only.

References: Li et al. 2022 (Large language models can be strong differentially private
learners: ghost clipping); Bu et al. 2023 (Differentially private optimization on large
model at small cost: Book-Keeping and the hybrid cost rule).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import traverse_util

from synthgen import clip_rounding
from synthgen.models.taps import ATTEND, LOOKUP, perturbation_name

# Exact-input products: at default precision an accelerator may round float32 inputs to
# TF32 or bf16, and a ghost norm that cancels (sum_ts of cross terms) would then understate
# the norm by more than `synthgen.clip_rounding` accounts for.
HIGHEST = jax.lax.Precision.HIGHEST

PyTree = Any
Path = tuple[str, ...]
TappedLossFn = Callable[[PyTree, PyTree, PyTree, dict[str, jax.Array]], tuple[jax.Array, PyTree]]
"""fn(trainable, frozen, perturbations, example) -> (loss, sown tap inputs)."""
NormRule = Literal["auto", "ghost", "materialise"]
NORM_RULES = ("auto", "ghost", "materialise")


def uses_ghost_norm(tokens: int, d_in: int, d_out: int) -> bool:
    """Bu et al.'s rule: the ghost norm (n^2 (d_in + d_out)) where cheaper than n d_in d_out."""
    return tokens * (d_in + d_out) < d_in * d_out


@dataclasses.dataclass(frozen=True)
class Use:
    """One tapped use of a trainable weight in an example's forward pass."""

    tap: Path  # the sown entry: module path + (tap name,)
    call: int  # which call of that tap (index in the sown tuple)
    kind: str  # "product" (x @ W), LOOKUP (W[ids]) or ATTEND (q @ W^T)
    out_shape: tuple[int, ...]  # the output's shape in one example (its perturbation's)
    out_dtype: Any = jnp.float32  # its perturbation's dtype: a product's is its input's

    @property
    def perturbation(self) -> Path:
        return (*self.tap[:-1], perturbation_name(self.tap[-1], self.call))


def tapped_uses(tapped_loss_fn: TappedLossFn, trainable, frozen, example) -> dict[Path, list[Use]]:
    """Trainable weights whose every use is tapped -> those uses (from one abstract trace)."""
    sown = jax.eval_shape(lambda ex: tapped_loss_fn(trainable, frozen, {}, ex)[1], example)
    sown = traverse_util.flatten_dict(sown) if sown else {}
    weights = traverse_util.flatten_dict(trainable)
    out: dict[Path, list[Use]] = {}
    for tap, recorded in sown.items():
        name = tap[-1]
        embedding = name in (LOOKUP, ATTEND)
        path = (*tap[:-1], "embedding") if embedding else tap
        weight = weights.get(path)
        if weight is None or weight.ndim < 2 or (embedding and weight.ndim != 2):
            continue  # frozen or not a matrix: not ours
        for call, r in enumerate(recorded):
            dtype = weight.dtype
            if name == LOOKUP:
                shape, kind = (*r.shape, weight.shape[1]), LOOKUP
            elif name == ATTEND:
                shape, kind = (*r.shape[:-1], weight.shape[0]), ATTEND
            else:  # LoraDense: x @ W.astype(x.dtype) has x's dtype
                shape, kind, dtype = (*r.shape[:-1], weight.shape[-1]), "product", r.dtype
            out.setdefault(path, []).append(Use(tap, call, kind, shape, dtype))
    return out


def _dot(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """An einsum with exact inputs and float32 accumulation, whatever the device's default.

    Float32 factors take HIGHEST precision (no TF32 or bf16 rounding of the inputs);
    bfloat16 factors (a bfloat16 model's) are exact in their own dtype and run on its fast
    units. Either way only the float32 accumulation rounds (`synthgen.clip_rounding`).
    """
    return jnp.einsum(spec, x, y, precision=HIGHEST, preferred_element_type=jnp.float32)


def _factors(use: Use, recorded, out_grad, micro: int, stack: int):
    """(A, B) with the example's gradient of the weight = sum over rows of A^T B.

    A is [micro, stack, n, rows of W] (ids [micro, stack, n] for a lookup), B is
    [micro, stack, n, columns of W], both in the dtype the model computed them in.
    """
    if use.kind == LOOKUP:
        return recorded.reshape(micro, 1, -1), out_grad.reshape(micro, 1, -1, out_grad.shape[-1])
    if use.kind == ATTEND:
        a = out_grad.reshape(micro, 1, -1, out_grad.shape[-1])
        return a, recorded.reshape(micro, 1, -1, recorded.shape[-1])
    a = recorded.reshape(micro, stack, -1, recorded.shape[-1])
    return a, out_grad.reshape(micro, stack, -1, out_grad.shape[-1])


def _gram(x: jax.Array, y: jax.Array) -> tuple[jax.Array, int]:
    """([micro, stack, n, m] inner products of the rows of x and y, their rounding chain)."""
    xs, k = clip_rounding.split_long_axis(x)
    if k == 1:
        return _dot("bsnd,bsmd->bsnm", x, y), x.shape[-1]
    ys, _ = clip_rounding.split_long_axis(y)
    partial = _dot("bsnkd,bsmkd->bsnmk", xs, ys)
    return jax.lax.optimization_barrier(jnp.sum(partial, axis=-1)), xs.shape[-1] + k


def _row_gram(a_u, a_v) -> tuple[jax.Array, int]:
    """[micro, stack, n_u, n_v] inner products of rows of A_u and A_v (ids: one-hot rows),
    and their rounding chain (0: exact)."""
    lookup_u, lookup_v = a_u.ndim == 3, a_v.ndim == 3
    if lookup_u and lookup_v:
        return (a_u[..., :, None] == a_v[..., None, :]).astype(jnp.float32), 0
    if lookup_u or lookup_v:
        ids, dense = (a_u, a_v) if lookup_u else (a_v, a_u)
        index = jnp.broadcast_to(ids[:, :, None, :], (*dense.shape[:3], ids.shape[-1]))
        picked = jnp.take_along_axis(dense, index, axis=3).astype(jnp.float32)
        return (jnp.swapaxes(picked, -1, -2) if lookup_u else picked), 0
    return _gram(a_u, a_v)


def _row_norms(a) -> tuple[jax.Array, int]:
    """([micro, stack, n] L2 norms of A's rows (a lookup's one-hot rows: 1), their chain)."""
    if a.ndim == 3:
        return jnp.ones(a.shape, jnp.float32), 0
    rows = jnp.square(a.astype(jnp.float32)).reshape(-1, a.shape[-1])
    squares, chain = clip_rounding.staged_sum(rows)
    return jnp.sqrt(squares).reshape(a.shape[:-1]), chain + 2


def clipped_sum(
    tapped_loss_fn: TappedLossFn,
    trainable: PyTree,
    frozen: PyTree,
    batch: dict[str, jax.Array],
    real: jax.Array,
    clip_norm: float,
    rule: NormRule = "auto",
):
    """Clipped per-example gradient sum of one microbatch (leading axis of `batch`).

    Args:
      tapped_loss_fn: the per-example loss with taps (`TappedLossFn`).
      trainable: parameters to differentiate.
      frozen: parameters held fixed.
      batch: examples, leaves [micro, ...].
      real: bool [micro], False for padding rows (they contribute 0).
      clip_norm: C.
      rule: "auto" (the cost rule per layer), or force "ghost" / "materialise" (tests) for
        weights used once by a product; an embedding, or any weight used more than once,
        always takes the ghost norm with its cross terms.

    Returns:
      (sum of clipped gradients shaped like `trainable` in float32, per-example losses,
      per-example norm bounds (`synthgen.clip_rounding`), kept: real rows whose gradient is
      finite).

    Privacy:
      Each kept example contributes c_i G_i with c_i = min(1, C / N_i) and N_i an upper
      bound of ||G_i|| that covers the float32 rounding of the ghost norms and of this
      step's products (`synthgen.clip_rounding.clip_norm_bound`): ||c_i G_i|| <= C at any
      device precision, since every product has exact inputs (`_dot`). A bfloat16 model's
      scaled output gradients are rounded to bfloat16 for the summed product; the bound
      includes that rounding (u = 2^-8 against sum_t ||a_t|| ||b_t||).
    """
    if rule not in NORM_RULES:
        raise ValueError(f"rule must be one of {NORM_RULES}, got {rule=}")
    example = jax.tree.map(lambda x: x[0], batch)
    uses = tapped_uses(tapped_loss_fn, trainable, frozen, example)
    flat = traverse_util.flatten_dict(trainable)
    weights = {p: flat[p] for p in uses}
    rest = {p: v for p, v in flat.items() if p not in uses}
    micro = real.shape[0]

    def per_example(rest, perturbations, ex):
        params = traverse_util.unflatten_dict({**weights, **rest})
        loss, sown = tapped_loss_fn(params, frozen, traverse_util.unflatten_dict(perturbations), ex)
        sown = traverse_util.flatten_dict(sown)
        return loss, {u.perturbation: sown[u.tap][u.call] for us in uses.values() for u in us}

    # A perturbation in the product's own dtype: its gradient, B, comes back in that dtype
    # unrounded (a bfloat16 model's output gradients are bfloat16 values).
    zeros = {
        u.perturbation: jnp.zeros((micro, *u.out_shape), u.out_dtype)
        for us in uses.values()
        for u in us
    }
    grad_fn = jax.value_and_grad(per_example, argnums=(0, 1), has_aux=True)
    (losses, recorded), (rest_grads, out_grads) = jax.vmap(grad_fn, in_axes=(None, 0, 0))(
        rest, zeros, batch
    )

    f32 = jnp.float32
    rows = {p: g.astype(f32) for p, g in rest_grads.items()}  # [micro, *shape]
    factors = {
        p: [
            _factors(
                u,
                recorded[u.perturbation],
                out_grads[u.perturbation],
                micro,
                math.prod(w.shape[:-2]),
            )
            for u in uses[p]
        ]
        for p, w in weights.items()
    }
    axes = lambda x: tuple(range(1, x.ndim))  # noqa: E731
    finite = jnp.ones((micro,), bool)
    for r in rows.values():
        finite &= jnp.all(jnp.isfinite(r), axis=axes(r))
    for pairs in factors.values():
        for a, b in pairs:
            if a.ndim == 4:
                finite &= jnp.all(jnp.isfinite(a), axis=(1, 2, 3))
            finite &= jnp.all(jnp.isfinite(b), axis=(1, 2, 3))
    keep = real & finite
    # Zero what is not kept *before* any product: 0 * inf would be NaN.
    rows = {p: jnp.where(_expand(keep, r), r, 0.0) for p, r in rows.items()}
    factors = {
        p: [
            (
                a if a.ndim == 3 else jnp.where(_expand(keep, a), a, 0),
                jnp.where(_expand(keep, b), b, 0),
            )
            for a, b in pairs
        ]
        for p, pairs in factors.items()
    }

    # Squared norms; the bound of the ghost norms' rounding (`slack`); and what the other
    # roundings are measured against: the squares of the materialised arrays (`positive`)
    # and, per ghost-normed weight, P^2 (`cross_weight`).
    zero = jnp.zeros((micro,), f32)
    squares, slack, positive, cross_weight = zero, zero, zero, zero
    norm_chain, sum_chain, additions = 0, 0, 0
    for r in rows.values():
        total, chain = clip_rounding.staged_sum(jnp.square(r))
        squares, positive = squares + total, positive + total
        norm_chain, additions = max(norm_chain, chain), additions + 1
    materialised = {}
    for p, pairs in factors.items():
        if len(pairs) == 1 and pairs[0][0].ndim == 4:
            ((a, b),) = pairs
            tokens, d_in, d_out = a.shape[2], a.shape[3], b.shape[3]
            if rule == "materialise" or (
                rule == "auto" and not uses_ghost_norm(tokens, d_in, d_out)
            ):
                per_example_grad = _dot("bsnd,bsne->bsde", a, b)
                total, chain = clip_rounding.staged_sum(jnp.square(per_example_grad))
                squares, positive = squares + total, positive + total
                norm_chain, additions = max(norm_chain, chain), additions + 1
                materialised[p] = per_example_grad
                continue
        # P_u = sum over the rows of use u of ||a_t|| ||b_t||: pair (u, v)'s Gram sum is off
        # by at most gamma(its chains) P_u P_v (`synthgen.clip_rounding`), its own slack.
        spreads = []
        for a, b in pairs:
            (norms_a, chain_a), (norms_b, chain_b) = _row_norms(a), _row_norms(b)
            p_u, chain = clip_rounding.staged_sum(norms_a * norms_b)
            spreads.append((p_u, chain_a + chain_b + chain + 1))
        for i, (a_u, b_u) in enumerate(pairs):
            for j in range(i, len(pairs)):
                a_v, b_v = pairs[j]
                (gram_a, chain_a), (gram_b, chain_b) = _row_gram(a_u, a_v), _gram(b_u, b_v)
                total, chain = clip_rounding.staged_sum(gram_a * gram_b)
                weight = 1.0 if i == j else 2.0
                squares = squares + weight * total
                (p_u, chain_u), (p_v, chain_v) = spreads[i], spreads[j]
                eps = clip_rounding.gamma(chain_a + chain_b + chain + 2 + chain_u + chain_v)
                slack = slack + (weight * eps) * p_u * p_v
                additions += 2
            # The summed product adds each entry over the microbatch's rows and tokens.
            sum_chain = max(sum_chain, micro * b_u.shape[2] + len(pairs) + 2)
        cross_weight = cross_weight + jnp.square(sum(p_u for p_u, _ in spreads))
    bf16_sum = any(b.dtype == jnp.bfloat16 for pairs in factors.values() for _, b in pairs)
    round_b = clip_rounding.BF16_UNIT if bf16_sum else 0.0
    norms = clip_rounding.clip_norm_bound(
        squares,
        slack,
        positive,
        cross_weight,
        norm_eps=clip_rounding.gamma(norm_chain + additions + 4),
        sum_eps_positive=clip_rounding.gamma(micro + 2),
        sum_eps_cross=(1 + round_b) * (1 + clip_rounding.gamma(sum_chain)) - 1,
    )
    # An overflow leaves inf or NaN: such a row is dropped like a non-finite gradient,
    # before any product with its values.
    keep &= jnp.isfinite(norms)
    scale = jnp.where(keep, jnp.minimum(1.0, clip_norm / jnp.maximum(norms, 1e-12)), 0.0)
    rows = {p: jnp.where(_expand(keep, r), r, 0.0) for p, r in rows.items()}
    materialised = {p: jnp.where(_expand(keep, g), g, 0.0) for p, g in materialised.items()}

    total = {p: jnp.tensordot(scale, r, axes=1).reshape(flat[p].shape) for p, r in rows.items()}
    for p, pairs in factors.items():
        shape = flat[p].shape
        if p in materialised:
            total[p] = jnp.tensordot(scale, materialised[p], axes=1).reshape(shape)
            continue
        summed = jnp.zeros(shape, f32).reshape(-1, *shape[-2:])
        for a, b in pairs:
            b = (b * scale[:, None, None, None]).astype(b.dtype)  # bf16: the u = 2^-8 above
            if a.ndim == 3:  # a lookup: scatter the output gradients into the looked-up rows
                summed = summed.at[0, a.reshape(-1)].add(b.reshape(-1, b.shape[-1]).astype(f32))
            else:
                summed = summed + _dot("bsnd,bsne->sde", a, b)
        total[p] = summed.reshape(shape)
    return traverse_util.unflatten_dict(total), losses, norms, keep


def _expand(mask: jax.Array, like: jax.Array) -> jax.Array:
    """[micro] -> [micro, 1, ...] broadcasting against `like`."""
    return mask.reshape(mask.shape + (1,) * (like.ndim - 1))

"""Clipped per-example gradient sums without per-example weight gradients (ghost clipping).

Ghost norms (Li et al. 2022) or materialised gradients per layer (Bu et al.'s cost rule),
then Book-Keeping sums from the same taps (`synthgen.models.lora.LoraDense` inputs and output
gradients), each example's product on its own; other parameters get `vmap(grad)` rows. See
docs/guides/querygen.md. A tapped weight is not differentiated by `grad`: an untapped use
would be missing from its norm and its sum (a biased gradient, not a larger sensitivity);
every use in the project's models is tapped (tested against the per-example path).

Privacy:
  The mechanism of `synthgen.dp_train`'s per-example path: every real example with a finite
  gradient contributes min(1, C / N_i) g_i, of L2 norm at most C; any other row exactly 0.
  The ghost identity is exact and N_i bounds ||g_i|| from above including the rounding and
  underflow of the norms and the summed products (`synthgen.clip_rounding`), all products
  with exact inputs and float32 accumulation (tested: none in `CLIP_SCOPE` without a named
  algorithm; every contribution, recomputed in float64, at most C). Removing an example
  also changes the rounding of adding the others' contributions, by at most
  2 gamma_k sum_j ||c_j G_j|| over k additions, as in every floating-point DP-SGD
  (`clipped_sum`). Shapes, the per-layer choice and the bounds depend on public shapes only.

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

PyTree = Any
Path = tuple[str, ...]
TappedLossFn = Callable[[PyTree, PyTree, PyTree, dict[str, jax.Array]], tuple[jax.Array, PyTree]]
"""fn(trainable, frozen, perturbations, example) -> (loss, sown tap inputs)."""
NormRule = Literal["auto", "ghost", "materialise"]
CLIP_SCOPE = "clip_bound"
"""The name scope of the norms, bounds and sums whose products must be exact (tested)."""
NORM_RULES = ("auto", "ghost", "materialise")
BookKeeping = Literal["per_example", "batched"]
BOOK_KEEPING = ("per_example", "batched")


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


def _factors(use: Use, recorded_inputs, out_grads, micro: int, stack: int):
    """(A, B) with the example's gradient of the weight = sum over rows of A^T B.

    A is [micro, stack, n, rows of W] (ids [micro, stack, n] for a lookup), B is
    [micro, stack, n, columns of W], both in the dtype the model computed them in; read
    from the recorded inputs and output gradients, keyed by `use.perturbation`.
    """
    recorded, out_grad = recorded_inputs[use.perturbation], out_grads[use.perturbation]
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
        return clip_rounding.exact_einsum("bsnd,bsmd->bsnm", x, y), x.shape[-1]
    ys, _ = clip_rounding.split_long_axis(y)
    partial = jax.lax.optimization_barrier(clip_rounding.exact_einsum("bsnkd,bsmkd->bsnmk", xs, ys))
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


def per_example_factors(
    tapped_loss_fn: TappedLossFn, trainable: PyTree, frozen: PyTree, batch: dict[str, jax.Array]
) -> tuple[jax.Array, dict[Path, jax.Array], dict[Path, list[tuple[jax.Array, jax.Array]]]]:
    """One backward pass over a microbatch: what the clipping reads, before any check.

    Returns:
      (per-example losses [micro]; per-example gradients of the weights that are not tapped,
      path -> float32 [micro, the weight's shape]; the tapped weights' factors, path -> a
      list of (A, B), one per use, example i's gradient of the weight the sum over uses of
      A_i^T B_i (`_factors`)).
      Tests and `scripts/bench_clip_bound.py` recompute the exact norms from these.
    """
    example = jax.tree.map(lambda x: x[0], batch)
    uses = tapped_uses(tapped_loss_fn, trainable, frozen, example)
    flat = traverse_util.flatten_dict(trainable)
    weights = {p: flat[p] for p in uses}
    rest = {p: v for p, v in flat.items() if p not in uses}
    micro = jax.tree.leaves(batch)[0].shape[0]

    def per_example(rest, perturbations, ex):
        params = traverse_util.unflatten_dict({**weights, **rest})
        loss, sown = tapped_loss_fn(params, frozen, traverse_util.unflatten_dict(perturbations), ex)
        sown = traverse_util.flatten_dict(sown)
        return loss, {u.perturbation: sown[u.tap][u.call] for us in uses.values() for u in us}

    # A perturbation in the product's own dtype, so that B is an array of that dtype: a
    # bfloat16 model's Gram and summed products then run on bfloat16 units (its values are
    # bfloat16 either way: `tap` adds the perturbation in the output's dtype).
    zeros = {
        u.perturbation: jnp.zeros((micro, *u.out_shape), u.out_dtype)
        for us in uses.values()
        for u in us
    }
    grad_fn = jax.value_and_grad(per_example, argnums=(0, 1), has_aux=True)
    (losses, recorded), (rest_grads, out_grads) = jax.vmap(grad_fn, in_axes=(None, 0, 0))(
        rest, zeros, batch
    )

    rows = {p: g.astype(jnp.float32) for p, g in rest_grads.items()}  # [micro, *shape]
    factors = {
        p: [_factors(u, recorded, out_grads, micro, math.prod(w.shape[:-2])) for u in uses[p]]
        for p, w in weights.items()
    }
    return losses, rows, factors


def clipped_sum(
    tapped_loss_fn: TappedLossFn,
    trainable: PyTree,
    frozen: PyTree,
    batch: dict[str, jax.Array],
    real: jax.Array,
    clip_norm: float,
    rule: NormRule = "auto",
    book_keeping: BookKeeping = "per_example",
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
      book_keeping: how a ghost-normed weight's clipped sum is formed: "per_example" (each
        example's product on its own into one buffer, see Privacy) or "batched" (Bu et al.'s
        one product over the microbatch; kept to measure against, `bench_clip_bound.py`).

    Returns:
      (sum of clipped gradients shaped like `trainable` in float32, per-example losses,
      per-example norm bounds (`synthgen.clip_rounding`), kept: real rows whose gradient is
      finite).

    Privacy:
      Each kept example contributes c_i G_i, c_i = min(1, C / N_i), N_i an upper bound of
      ||G_i|| (`synthgen.clip_rounding.clip_norm_bound`), so ||c_i G_i|| <= C at any device
      precision; a bfloat16 model's scaled output gradients are rounded to bfloat16 for the
      summed product, and the bound covers it (2^-8 against sum_t ||a_t|| ||b_t||).

      Removing an example also changes how the others' terms round where they are added.
      "per_example" adds each contribution on its own, so the change is at most
      2 gamma_m sum_j ||c_j G_j|| <= 2 gamma_m m C over a microbatch of m (as on the
      per-example path); "batched" adds every per-token term in one product, up to
      2 gamma_{m n} sum_j c_j P_j, P_j = sum_t ||a_t|| ||b_t|| (far larger: the table in
      docs/guides/querygen.md, from `scripts/bench_clip_bound.py`).
    """
    if rule not in NORM_RULES:
        raise ValueError(f"rule must be one of {NORM_RULES}, got {rule=}")
    if book_keeping not in BOOK_KEEPING:
        raise ValueError(f"book_keeping must be one of {BOOK_KEEPING}, got {book_keeping=}")
    losses, rows, factors = per_example_factors(tapped_loss_fn, trainable, frozen, batch)
    flat = traverse_util.flatten_dict(trainable)
    micro = real.shape[0]
    (rows, factors), keep = keep_finite((rows, factors), real)  # lookup ids stay as they are
    with jax.named_scope(CLIP_SCOPE):
        sizes = {p: flat[p].size for p in factors}
        norms, materialised = _norm_bounds(rows, factors, sizes, micro, rule, book_keeping)
        # An overflow leaves inf or NaN: such a row is dropped like a non-finite gradient,
        # before any product with its values.
        keep &= jnp.isfinite(norms)
        scale = clip_factors(keep, norms, clip_norm)
        total = _summed(flat, rows, factors, materialised, keep, scale, book_keeping)
        return total, losses, norms, keep


def _norm_bounds(rows, factors, sizes: dict, micro: int, rule: NormRule, book_keeping: BookKeeping):
    """([micro] upper bounds N_i of the per-example norms, the materialised gradients).

    Materialised arrays (`rows`, and weights the cost rule does not ghost-norm) add their
    squares; each ghost-normed weight adds its Gram sums and, per Gram pair (u, v), the
    bound of their rounding gamma(chains) P_u P_v with P_u = sum_t ||a_t|| ||b_t||, and of
    their underflow (`synthgen.clip_rounding`).
    """
    materialised = {}
    for p, pairs in factors.items():
        if len(pairs) == 1 and pairs[0][0].ndim == 4:
            ((a, b),) = pairs
            tokens, d_in, d_out = a.shape[2], a.shape[3], b.shape[3]
            if rule == "materialise" or (
                rule == "auto" and not uses_ghost_norm(tokens, d_in, d_out)
            ):
                materialised[p] = clip_rounding.exact_einsum("bsnd,bsne->bsde", a, b)
    # Read twice, by the squares below and by the clipped sum (`_summed`): the barrier makes
    # both read these very values (no backend recomputes the product per use).
    materialised = jax.lax.optimization_barrier(materialised)
    arrays = [*rows.values(), *materialised.values()]
    squares, norm_chain, entries = clip_rounding.sum_of_squares(arrays, micro)
    positive, slack = squares, jnp.full((micro,), clip_rounding.TINY * entries, jnp.float32)
    # The summed products' rounding: their chains, and an absolute underflow (Frobenius).
    sum_chain, sum_tiny = 0, jnp.zeros((micro,), jnp.float32)
    sum_tiny += sum(math.sqrt(math.prod(x.shape[1:])) for x in arrays) * micro
    cross_weight, additions = jnp.zeros((micro,), jnp.float32), len(arrays)
    for p, pairs in factors.items():
        if p in materialised:
            continue
        spreads = [_spread(a, b) for a, b in pairs]
        for i, (a_u, b_u) in enumerate(pairs):
            for j in range(i, len(pairs)):
                a_v, b_v = pairs[j]
                (gram_a, chain_ga), (gram_b, chain_gb) = _row_gram(a_u, a_v), _gram(b_u, b_v)
                total, chain = clip_rounding.staged_sum(gram_a * gram_b)
                pair_weight = 1.0 if i == j else 2.0
                squares = squares + pair_weight * total
                u, v = spreads[i], spreads[j]
                eps = clip_rounding.gamma(chain_ga + chain_gb + chain + 2 + u.chain + v.chain)
                # Underflow: each Gram entry is off by at most 2 d TINY times the other
                # factor's largest squared row norm; n_u n_v such products are summed.
                d_a, d_b = (0 if a_u.ndim == 3 else a_u.shape[-1]), b_u.shape[-1]
                tiny = 2 * clip_rounding.TINY * gram_a.shape[-1] * gram_a.shape[-2]
                underflow = tiny * (
                    d_a * (jnp.maximum(u.b_max, v.b_max) + 1)
                    + d_b * (jnp.maximum(u.a_max, v.a_max) + 1)
                    + 1
                )
                slack = slack + pair_weight * (eps * u.spread * v.spread + underflow)
                additions += 2
        # The summed product's chain: per example (`_add_example`), each use's product over
        # its tokens, the uses added, then one addition per example into the buffer; batched,
        # every use's rows of the whole microbatch in one buffer.
        tokens = sum(b.shape[2] for _, b in pairs)
        if book_keeping == "per_example":
            sum_chain = max(sum_chain, tokens + len(pairs) + micro + 2)
        else:
            sum_chain = max(sum_chain, micro * tokens + len(pairs) + 2)
        a_max = jnp.max(jnp.stack([s.a_max for s in spreads]), axis=0)
        sum_tiny = sum_tiny + math.sqrt(sizes[p]) * micro * tokens * 2 * (a_max + 1)
        cross_weight = cross_weight + jnp.square(sum(s.spread for s in spreads))
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
        sum_tiny=clip_rounding.TINY * sum_tiny,
    )
    return norms, materialised


@dataclasses.dataclass(frozen=True)
class _Spread:
    """One use's P = sum_t ||a_t|| ||b_t|| [micro], its rounding chain and the largest
    squared row norms of A and B [micro] (their underflow's scale)."""

    spread: jax.Array
    chain: int
    a_max: jax.Array
    b_max: jax.Array


def _spread(a, b) -> _Spread:
    """One use's `_Spread`."""
    (norms_a, chain_a), (norms_b, chain_b) = _row_norms(a), _row_norms(b)
    spread, chain = clip_rounding.staged_sum(norms_a * norms_b)
    square_max = lambda x: jnp.max(jnp.square(x), axis=(1, 2))  # noqa: E731
    return _Spread(spread, chain_a + chain_b + chain + 1, square_max(norms_a), square_max(norms_b))


def _summed(flat, rows, factors, materialised, keep, scale, book_keeping: BookKeeping):
    """The clipped sum of every trainable weight: sum_i c_i G_i, in float32.

    Rows and materialised gradients: one exact-input product with the clip factors (a chain
    of micro additions across examples). Ghost-normed weights (Book-Keeping): per example
    (`_add_example`, a scan over the microbatch into one buffer per weight), or with
    "batched" one product of A with the scaled B over the whole microbatch. A bfloat16
    model's scaled B is rounded to bfloat16 (the u = 2^-8 of `_norm_bounds`).
    """
    total = {}
    for p, r in {**rows, **materialised}.items():
        r = zero_unkept(keep, r)
        total[p] = clip_rounding.exact_einsum("b,b...->...", scale, r).reshape(flat[p].shape)
    ghost = {p: pairs for p, pairs in factors.items() if p not in materialised}
    buffers = {
        p: jnp.zeros(flat[p].shape, jnp.float32).reshape(-1, *flat[p].shape[-2:]) for p in ghost
    }
    if book_keeping == "batched":
        for p, pairs in ghost.items():
            for a, b in pairs:
                b = (b * scale[:, None, None, None]).astype(b.dtype)
                if a.ndim == 3:  # a lookup: scatter the output gradients into looked-up rows
                    rows_b = b.reshape(-1, b.shape[-1]).astype(jnp.float32)
                    buffers[p] = buffers[p].at[0, a.reshape(-1)].add(rows_b)
                else:
                    buffers[p] = buffers[p] + clip_rounding.exact_einsum("bsnd,bsne->sde", a, b)
    elif ghost:

        def add_example(acc, inputs):
            pairs_i, c = inputs
            return {p: _add_example(acc[p], pairs_i[p], c) for p in acc}, None

        buffers, _ = jax.lax.scan(add_example, buffers, (ghost, scale))
    for p, summed in buffers.items():
        total[p] = summed.reshape(flat[p].shape)
    return traverse_util.unflatten_dict(total)


def _add_example(acc: jax.Array, pairs, c: jax.Array) -> jax.Array:
    """acc + c A^T B for one example's factors (A [s, n, d] or ids [1, n], B [s, n, e]).

    The example's contribution is computed on its own: each use's product over its tokens,
    the uses added, a lookup's output gradients summed per distinct id first (an exact-input
    product with the 0/1 matrix of equal ids), and only then added to `acc`, one rounding per
    entry (behind a barrier, so that no backend accumulates the example's terms into `acc`
    one by one). The rounding of the other examples' contributions then does not depend on
    this example's terms, only on its sum (see `clipped_sum`).
    """
    products = [(a, (b * c).astype(b.dtype)) for a, b in pairs if a.ndim == 3]
    lookups = [(a, (b * c).astype(b.dtype)) for a, b in pairs if a.ndim == 2]
    part = None
    for a, b in products:
        product = clip_rounding.exact_einsum("snd,sne->sde", a, b)
        part = product if part is None else part + product
    if lookups:
        ids = jnp.concatenate([a.reshape(-1) for a, _ in lookups])
        rows = jnp.concatenate([b.reshape(-1, b.shape[-1]) for _, b in lookups])
        same = ids[:, None] == ids[None, :]
        grouped = clip_rounding.exact_einsum("ts,se->te", same.astype(jnp.float32), rows)
        first = ~jnp.any(jnp.tril(same, -1), axis=1)  # one row per distinct id, the rest 0
        grouped = jnp.where(first[:, None], grouped, 0.0)
        if part is None:  # acc_v + S_v once per distinct id v; adding 0 is exact
            return acc.at[0, ids].add(grouped)
        part = part.at[0, ids].add(grouped)
    return acc + jax.lax.optimization_barrier(part)


def keep_finite(tree: PyTree, real: jax.Array) -> tuple[PyTree, jax.Array]:
    """(tree, keep [micro]): keep marks the `real` rows whose floating leaves [micro, ...] are
    all finite, and the rows not kept are zeroed in every floating leaf (integer leaves, a
    lookup's ids, are left as they are).

    Zeroed *before* any product: 0 * inf would be NaN. The values are read by the finiteness
    check, the norms and the sums: a barrier before the check and one after the zeroing make
    all of them read the very same values (no backend recomputes a producer per reader).
    """

    def floating(x: jax.Array) -> bool:
        return jnp.issubdtype(x.dtype, jnp.inexact)

    tree = jax.lax.optimization_barrier(tree)
    keep = real
    for x in filter(floating, jax.tree.leaves(tree)):
        keep &= jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim)))
    tree = jax.tree.map(lambda x: zero_unkept(keep, x) if floating(x) else x, tree)
    return jax.lax.optimization_barrier(tree), keep


def clip_factors(keep: jax.Array, norms: jax.Array, clip_norm: float) -> jax.Array:
    """[micro] clip factors min(1, C / N_i) of the kept rows, 0 for the others.

    Privacy: a clipped row's norm is at most C only when `norms` are upper bounds from
    `clip_rounding.clip_norm_bound`, whose 1 + 32u margin covers this division (counted
    twice for a GPU's approximate float32 division); other norms void the bound.
    """
    return jnp.where(keep, jnp.minimum(1.0, clip_norm / jnp.maximum(norms, 1e-12)), 0.0)


def zero_unkept(keep: jax.Array, x: jax.Array) -> jax.Array:
    """x [micro, ...] with the rows that are not kept set to 0."""
    return jnp.where(keep.reshape(keep.shape + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))

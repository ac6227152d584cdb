"""Ghost clipping: the same clipped sum as per-example gradients, on T5 and Llama, full and LoRA."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from synthgen import clip_rounding, dp_train, ghost_clipping
from synthgen.generator_models import LlamaFamily, T5Family, split_trainable
from synthgen.models.llama import Llama, LlamaConfig
from synthgen.models.lora import LoraDense
from synthgen.models.t5 import T5, T5Config
from synthgen.models.taps import TAP_INPUTS, TAP_OUTPUTS


def _t5(lora_rank: int):
    cfg = T5Config.preset("tiny", lora_rank=lora_rank)
    family = T5Family(cfg, tokenizer=None)
    rng = np.random.default_rng(0)
    n, input_len, target_len = 6, 12, 5
    ids = rng.integers(2, cfg.vocab_size, size=(n, input_len), dtype=np.int32)
    input_mask = np.ones((n, input_len), np.float32)
    input_mask[0, 7:] = 0  # one padded input
    targets = rng.integers(2, cfg.vocab_size, size=(n, target_len), dtype=np.int32)
    target_mask = np.ones((n, target_len), np.float32)
    target_mask[1, 3:] = 0
    data = dict(input_ids=ids, input_mask=input_mask, targets=targets, target_mask=target_mask)
    params = T5(cfg).init(jax.random.key(0), ids[:1], input_mask[:1], targets[:1])["params"]
    return family, _move_lora_b(params), data


def _llama(lora_rank: int, tied: bool = False):
    cfg = LlamaConfig.tiny(vocab_size=96, lora_rank=lora_rank, tie_word_embeddings=tied)
    family = LlamaFamily(cfg, tokenizer=None)
    rng = np.random.default_rng(1)
    n, total, target_len = 6, 16, 5
    tokens = rng.integers(3, cfg.vocab_size, size=(n, total), dtype=np.int32)
    attention_mask = np.ones((n, total), np.float32)
    attention_mask[2, 12:] = 0
    starts = rng.integers(4, total - target_len, size=n).astype(np.int32)
    targets = np.stack([tokens[i, s + 1 : s + 1 + target_len] for i, s in enumerate(starts)])
    target_mask = np.ones((n, target_len), np.float32)
    target_mask[3, 2:] = 0
    data = dict(
        tokens=tokens,
        attention_mask=attention_mask,
        target_start=starts,
        targets=targets,
        target_mask=target_mask,
    )
    params = Llama(cfg).init(jax.random.key(0), tokens[:1])["params"]
    return family, _move_lora_b(params), data


def _move_lora_b(params):
    """B starts at 0, which would make the A gradients 0 on both paths: move it."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.05 if p[-1].key == "lora_b" else x, params
    )


def _sums(family, params, data, *, lora, clip, rule):
    trainable, frozen = split_trainable(params, lora=lora)
    shaped = {k: jnp.asarray(v).reshape(2, 3, *v.shape[1:]) for k, v in data.items()}
    mask = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)  # one padding row
    reference = jax.jit(dp_train.make_clipped_grad_sum(family.loss_fn(), clip))
    ghost = jax.jit(
        dp_train.make_clipped_grad_sum(
            family.loss_fn(), clip, tapped_loss_fn=family.tapped_loss_fn(), norm_rule=rule
        )
    )
    return reference(trainable, frozen, shaped, mask), ghost(trainable, frozen, shaped, mask)


def _norm_margin(family, params, data, *, lora, rule="auto"):
    """max_i N_ghost / N_vmap - 1: how much more the ghost path's rounding bound adds."""
    trainable, frozen = split_trainable(params, lora=lora)
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    real = jnp.ones(len(data["targets"]), bool)
    ghost = jax.jit(
        lambda t, f, b: ghost_clipping.clipped_sum(
            family.tapped_loss_fn(), t, f, b, real, 1.0, rule
        )
    )(trainable, frozen, batch)[2]
    vmap = jax.jit(dp_train._vmap_clipped_sum(family.loss_fn(), 1.0))(
        trainable, frozen, batch, real
    )[2]
    return float(jnp.max(ghost / vmap)) - 1.0


def _assert_same(want, got, margin=0.0):
    """Equal sums up to float32 rounding (1e-4 here) and clip factors `margin` apart.

    Each example's factor may differ by the relative `margin`: an entry moves by at most
    `margin` times the sum of its terms' magnitudes, at most a few times the largest entry.
    """
    (w_sum, w_loss, w_counts), (g_sum, g_loss, g_counts) = want, got
    assert jax.tree.structure(w_sum) == jax.tree.structure(g_sum)
    for a, b in zip(jax.tree.leaves(w_sum), jax.tree.leaves(g_sum), strict=True):
        assert float(jnp.max(jnp.abs(a))) > 0  # every leaf has a gradient to compare
        largest = float(jnp.max(jnp.abs(a)))
        np.testing.assert_allclose(b, a, rtol=1e-4 + margin, atol=(1e-5 + 4 * margin) * largest)
    np.testing.assert_allclose(g_loss, w_loss, rtol=1e-5)
    assert int(g_counts.clipped) == int(w_counts.clipped)
    assert int(g_counts.nonfinite) == int(w_counts.nonfinite) == 0


@pytest.mark.parametrize(
    "model, lora_rank, rule",
    [
        ("t5", 0, "auto"),
        ("t5", 2, "auto"),
        ("llama", 0, "auto"),
        ("llama", 2, "auto"),
        ("llama-tied", 0, "auto"),  # one table for the lookup and the output layer
        ("t5", 0, "ghost"),  # every layer by its ghost norm
        ("llama", 0, "materialise"),  # every layer by its materialised gradient
    ],
)
def test_ghost_sum_equals_per_example_sum(model, lora_rank, rule):
    if model == "t5":
        family, params, data = _t5(lora_rank)
    else:
        family, params, data = _llama(lora_rank, tied=model == "llama-tied")
    lora = lora_rank > 0
    # The ghost identity is exact arithmetic: compare the paths with float32 products on every
    # device (on a GPU, JAX's default runs the model's products in TF32, and the two paths
    # differentiate the weights by different products; the clip bound at the device's own
    # precision is the float64 test below).
    with jax.default_matmul_precision("float32"):
        # A clip norm below most gradient norms, so the factors differ per example.
        want, got = _sums(family, params, data, lora=lora, clip=0.05, rule=rule)
        # The ghost norms' rounding bound (synthgen.clip_rounding) is an upper bound of the
        # per-example norm (>= 0 up to the vmap path's own margin) that stays small.
        margin = _norm_margin(family, params, data, lora=lora, rule=rule)
    assert int(want[2].clipped) >= 3
    assert -1e-5 <= margin <= 1e-3
    _assert_same(want, got, margin)


def test_every_weight_matrix_is_tapped():
    """Full fine-tuning: every projection and the embedding go the tapped path."""
    family, params, data = _llama(0, tied=True)
    example = {k: jnp.asarray(v[0]) for k, v in data.items()}
    uses = ghost_clipping.tapped_uses(family.tapped_loss_fn(), params, {}, example)
    names = {p[-2] for p in uses}
    assert names == {"q", "k", "v", "o", "gate", "up", "down", "embed"}
    cfg, tokens = family.config, data["tokens"].shape[1]
    (q,) = uses[("layers", "attn", "q", "kernel")]
    assert q.out_shape == (cfg.num_layers, 1, tokens, cfg.num_heads * cfg.head_dim)
    attend, lookup = sorted(uses[("embed", "embedding")], key=lambda u: u.kind)
    assert (lookup.kind, lookup.out_shape) == ("lookup", (1, tokens, cfg.hidden_size))
    assert (attend.kind, attend.out_shape) == ("attend", (1, data["targets"].shape[1], 96))
    # T5: encoder and decoder lookups (two calls of one tap) and the tied output layer.
    family, params, data = _t5(0)
    example = {k: jnp.asarray(v[0]) for k, v in data.items()}
    uses = ghost_clipping.tapped_uses(family.tapped_loss_fn(), params, {}, example)
    kinds = [(u.kind, u.call) for u in uses[("shared", "embedding")]]
    assert sorted(kinds) == [("attend", 0), ("lookup", 0), ("lookup", 1)]


def test_taps_are_inert_without_their_collections():
    layer = LoraDense(3, rank=2)
    x = jnp.ones((2, 4))
    variables = layer.init(jax.random.key(0), x)
    assert set(variables) == {"params"}  # init creates no tap collections
    y, state = layer.apply(variables, x, mutable=[TAP_INPUTS])
    assert set(state[TAP_INPUTS]) == {"kernel", "lora_a", "lora_b"}
    zeros = {name: jnp.zeros(s) for name, s in [("kernel", (2, 3)), ("lora_a", (2, 2))]}
    zeros["lora_b"] = jnp.zeros((2, 3))
    np.testing.assert_array_equal(layer.apply({**variables, TAP_OUTPUTS: zeros}, x), y)


class _Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(LoraDense(16, use_bias=True, name="inner")(x))
        return nn.LayerNorm(name="norm")(LoraDense(4, name="outer")(h)).sum()


def _mlp_losses():
    model = _Mlp()

    def loss(trainable, frozen, ex):
        return model.apply({"params": trainable}, ex["x"])

    def tapped(trainable, frozen, perturbations, ex):
        out, state = model.apply(
            {"params": trainable, TAP_OUTPUTS: perturbations}, ex["x"], mutable=[TAP_INPUTS]
        )
        return out, state[TAP_INPUTS]

    params = model.init(jax.random.key(0), jnp.ones((5, 8)))["params"]
    return loss, tapped, params


def test_nonfinite_example_contributes_nothing():
    loss, tapped, params = _mlp_losses()
    x = np.random.default_rng(0).normal(size=(1, 4, 5, 8)).astype(np.float32)
    bad = x.copy()
    bad[0, 2, 1, 3] = np.inf
    mask = jnp.ones((1, 4))
    fn = jax.jit(dp_train.make_clipped_grad_sum(loss, 1.0, tapped_loss_fn=tapped))
    ref = jax.jit(dp_train.make_clipped_grad_sum(loss, 1.0))
    without = fn(params, {}, {"x": jnp.asarray(x)}, mask.at[0, 2].set(0))
    got = fn(params, {}, {"x": jnp.asarray(bad)}, mask)
    assert int(got[2].nonfinite) == 1
    for a, b in zip(jax.tree.leaves(without[0]), jax.tree.leaves(got[0]), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6)
    # The bias, the norm's scale and offset take the vmap path; the kernels the tapped one.
    _assert_same(ref(params, {}, {"x": jnp.asarray(x)}, mask), fn(params, {}, {"x": x}, mask))


def test_overflowing_norm_is_dropped_not_nan():
    """Finite activations whose ghost norm overflows float32: the row is dropped, no NaN."""
    loss, tapped, params = _mlp_losses()
    x = np.random.default_rng(1).normal(size=(1, 3, 5, 8)).astype(np.float32)
    x[0, 1] *= 1e25  # x_t . x_s ~ 1e50: inf in float32
    fn = jax.jit(dp_train.make_clipped_grad_sum(loss, 1.0, tapped_loss_fn=tapped))
    total, _, counts = fn(params, {}, {"x": jnp.asarray(x)}, jnp.ones((1, 3)))
    assert all(bool(jnp.all(jnp.isfinite(t))) for t in jax.tree.leaves(total))
    assert int(counts.nonfinite) == 1


def test_cost_rule():
    assert ghost_clipping.uses_ghost_norm(128, 512, 2048)  # long sequence, wide layer
    assert not ghost_clipping.uses_ghost_norm(128, 576, 8)  # a LoRA adapter
    with pytest.raises(ValueError, match="rule"):
        ghost_clipping.clipped_sum(None, {}, {}, {"x": jnp.ones((1, 1))}, jnp.ones(1, bool), 1, "x")


def _contribution_norms(family, params, data, *, clip, ghost):
    """Each example's released contribution, alone in its microbatch, normed in float64."""
    n = len(data["targets"])
    shaped = {k: jnp.asarray(v).reshape(1, n, *v.shape[1:]) for k, v in data.items()}
    tapped = family.tapped_loss_fn() if ghost else None
    fn = jax.jit(dp_train.make_clipped_grad_sum(family.loss_fn(), clip, tapped_loss_fn=tapped))
    norms = []
    for i in range(n):
        mask = jnp.zeros((1, n), jnp.float32).at[0, i].set(1)
        total = fn(params, {}, shaped, mask)[0]
        squares = sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(total))
        norms.append(np.sqrt(squares))
    return np.array(norms)


@pytest.mark.parametrize("ghost", [True, False], ids=["ghost", "vmap"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_contribution_is_within_the_clip_norm_in_float64(ghost, dtype):
    """||c_i g_i|| <= C exactly, as released, at the device's precision and the model's dtype.

    A computed norm is off by its rounding either way; without the bound of
    `synthgen.clip_rounding` about half the clipped examples exceed C (by ~1e-7 in float32,
    more on an accelerator's TF32 or bf16).
    """
    _check_contributions(T5Config.preset("tiny", dtype=dtype), ghost, 12, 12, 5)


@pytest.mark.accelerator
@pytest.mark.parametrize("ghost", [True, False], ids=["ghost", "vmap"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_contributions_within_the_clip_norm_at_t5_small_on_the_device(ghost, dtype):
    """The same at t5-small's dimensions and 128/32 tokens, at the device's default precision."""
    _check_contributions(T5Config.preset("small", dtype=dtype), ghost, 8, 128, 32)


def _check_contributions(cfg, ghost, n, input_len, target_len):
    family = T5Family(cfg, tokenizer=None)
    rng = np.random.default_rng(3)
    ids = rng.integers(2, cfg.vocab_size, size=(n, input_len), dtype=np.int32)
    targets = rng.integers(2, cfg.vocab_size, size=(n, target_len), dtype=np.int32)
    data = dict(
        input_ids=ids,
        input_mask=np.ones((n, input_len), np.float32),
        targets=targets,
        target_mask=np.ones((n, target_len), np.float32),
    )
    params = T5(cfg).init(jax.random.key(0), ids[:1], ids[:1] * 0 + 1, targets[:1])["params"]
    clip = 0.05
    norms = _contribution_norms(family, params, data, clip=clip, ghost=ghost)
    assert np.all(norms <= clip), norms / clip - 1
    # The lower check, derived: c_i = C / N_i, and the released contribution differs from
    # c_i G_i by at most c_i (N_i - ||G_i||) (the part of N_i above ||G_i|| bounds the summed
    # products' rounding), so it is at least C (2 ||G_i|| / N_i - 1), about C (1 - 2 eta_i).
    # ||G_i|| is recomputed here as the step defines it (`_exact_norms`), to a relative
    # `u_ref`: the recomputation is another compiled program, whose bfloat16 values may
    # round differently (2^-8) or whose float32 sums may add in another order (far below
    # 2^-16 at these lengths).
    u_ref = clip_rounding.BF16_UNIT if cfg.dtype == "bfloat16" else 2.0**-16
    exact = (1 - u_ref) * _exact_norms(family, params, data, ghost=ghost)
    bounds = _norm_bounds(family, params, data, ghost=ghost)
    assert np.all(bounds >= exact), bounds / exact - 1  # N_i bounds the norm
    assert np.all(norms >= clip * (2 * exact / bounds - 1)), (norms / clip, bounds / exact - 1)


def _norm_bounds(family, params, data, *, ghost):
    """The step's N_i of each example (one microbatch of all, as `_contribution_norms`)."""
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    real = jnp.ones(len(data["targets"]), bool)
    if ghost:
        tapped = family.tapped_loss_fn()
        fn = jax.jit(lambda p, b: ghost_clipping.clipped_sum(tapped, p, {}, b, real, 1.0)[2])
    else:
        vmapped = dp_train._vmap_clipped_sum(family.loss_fn(), 1.0)
        fn = jax.jit(lambda p, b: vmapped(p, {}, b, real)[2])
    return np.asarray(fn(params, batch), np.float64)


def _exact_norms(family, params, data, *, ghost):
    """||G_i|| in float64 of each example's gradient as the step defines it: on the vmap path
    the materialised `vmap(grad)` array; on the ghost path the exact products of the factors
    the step records (`ghost_clipping.per_example_factors`), and the other weights' rows."""
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    if not ghost:
        grads = jax.jit(jax.vmap(jax.grad(family.loss_fn()), in_axes=(None, None, 0)))(
            params, {}, batch
        )
        squares = [np.square(np.asarray(g, np.float64)) for g in jax.tree.leaves(grads)]
        return np.sqrt(sum(x.reshape(len(x), -1).sum(axis=1) for x in squares))
    tapped = family.tapped_loss_fn()
    _, rows, factors = jax.jit(lambda p, b: ghost_clipping.per_example_factors(tapped, p, {}, b))(
        params, batch
    )
    flat = traverse_util.flatten_dict(params)
    out = np.zeros(len(data["targets"]))
    for r in rows.values():
        out += np.square(np.asarray(r, np.float64)).reshape(len(out), -1).sum(axis=1)
    for p, pairs in factors.items():
        pairs = [(np.asarray(a), np.asarray(b, np.float64)) for a, b in pairs]
        for i in range(len(out)):
            g = np.zeros((math.prod(flat[p].shape[:-2]), *flat[p].shape[-2:]))
            for a, b in pairs:
                if a.ndim == 3:  # a lookup: ids [micro, 1, n]
                    np.add.at(g[0], a[i, 0], b[i, 0])
                else:
                    g += np.swapaxes(a[i].astype(np.float64), 1, 2) @ b[i]  # BLAS
            out[i] += np.sum(np.square(g))
    return np.sqrt(out)


def _equations(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it (scan bodies, jit calls)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


@pytest.mark.parametrize("ghost", [True, False], ids=["ghost", "vmap"])
def test_every_product_of_the_clipping_names_its_algorithm(ghost):
    """No product the bound relies on runs at the device's default precision (TF32 on a GPU,
    bf16 on a TPU): each names an exact-input algorithm. CPUs ignore precision, so this is
    what catches a missing one here."""
    loss, tapped, params = _mlp_losses()
    fn = dp_train.make_clipped_grad_sum(loss, 1.0, tapped_loss_fn=tapped if ghost else None)
    jaxpr = jax.make_jaxpr(fn)(params, {}, {"x": jnp.ones((1, 4, 5, 8))}, jnp.ones((1, 4)))
    dots = [
        eqn
        for eqn in _equations(jaxpr.jaxpr)
        if eqn.primitive.name == "dot_general"
        and ghost_clipping.CLIP_SCOPE in str(eqn.source_info.name_stack)
    ]
    assert len(dots) >= 4  # the squares' norms and the sums (and the Grams) are all here
    for eqn in dots:
        assert str(eqn.params["precision"]) in ("F32_F32_F32", "BF16_BF16_F32"), eqn


_PASS_THROUGH = {"convert_element_type", "reshape", "squeeze", "expand_dims", "broadcast_in_dim"}


def _origins(var, producers) -> list:
    """The equations whose values `var` carries, through casts, reshapes and selections."""
    eqn = producers.get(var) if isinstance(var, jax.extend.core.Var) else None
    if eqn is None:
        return []  # an argument or a constant
    name = eqn.primitive.name
    if name in _PASS_THROUGH or name == "select_n" or eqn.params.get("name") == "_where":
        floats = [v for v in eqn.invars if jnp.issubdtype(v.aval.dtype, jnp.floating)]
        return [origin for v in floats for origin in _origins(v, producers)]
    return [eqn]


@pytest.mark.parametrize("path", ["ghost", "materialise", "vmap"])
def test_the_clipping_reads_per_example_gradients_through_a_barrier(path):
    """The bound holds for the values whose norms it computes: the finiteness check, the
    norms and the sums must read the same per-example gradients. Every value the clipping
    reads from the backward pass, and every gradient it materialises, comes through an
    optimization barrier (no backend recomputes or fuses the producer into one reader and
    not another)."""
    loss, tapped, params = _mlp_losses()
    batch, real = {"x": jnp.ones((4, 5, 8))}, jnp.ones(4, bool)
    if path == "vmap":
        fn = dp_train._vmap_clipped_sum(loss, 1.0)
    else:
        rule = "auto" if path == "ghost" else "materialise"

        def fn(trainable, frozen, batch, real):
            return ghost_clipping.clipped_sum(tapped, trainable, frozen, batch, real, 1.0, rule)

    jaxpr = jax.make_jaxpr(fn)(params, {}, batch, real).jaxpr
    producers = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}
    scope = lambda eqn: str(eqn.source_info.name_stack)  # noqa: E731
    readers = [
        eqn
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "is_finite"
        or (
            ghost_clipping.CLIP_SCOPE in scope(eqn)
            and eqn.primitive.name != "optimization_barrier"  # the fences themselves
        )
    ]
    assert any(eqn.primitive.name == "is_finite" for eqn in readers)
    unfenced = set()
    for eqn in readers:
        for var in eqn.invars:
            if not jnp.issubdtype(var.aval.dtype, jnp.floating):
                continue  # masks and ids
            for origin in _origins(var, producers):
                inside = ghost_clipping.CLIP_SCOPE in scope(origin)
                materialised = inside and scope(origin).endswith("bsnd,bsne->bsde")
                if origin.primitive.name != "optimization_barrier" and (materialised or not inside):
                    unfenced.add(f"{eqn.primitive.name} reads {origin.primitive.name}")
    assert not unfenced, sorted(unfenced)


class _Twice(nn.Module):
    """loss = v . (x W) - (1 + delta) v . (x W): W's gradient -delta x^T v, from two uses
    whose ghost cross terms cancel to a relative delta^2 of their size."""

    @nn.compact
    def __call__(self, x, v, delta):
        dense = LoraDense(v.shape[-1], name="w")
        return jnp.sum(v * dense(x)) - (1 + delta) * jnp.sum(v * dense(x))


def _twice(n: int = 16, d: int = 64, delta: float = 1e-3):
    """`_Twice` on n examples of 16 tokens of width d (W is d x d):
    (loss, tapped loss, params, data)."""
    model = _Twice()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 16, d)).astype(np.float32)
    v = rng.normal(size=(n, 16, d)).astype(np.float32)
    deltas = np.full(n, delta, np.float32)
    params = model.init(jax.random.key(0), x[0], v[0], deltas[0])["params"]

    def loss(trainable, frozen, ex):
        return model.apply({"params": trainable}, ex["x"], ex["v"], ex["delta"])

    def tapped(trainable, frozen, perturbations, ex):
        out, state = model.apply(
            {"params": trainable, TAP_OUTPUTS: perturbations},
            ex["x"],
            ex["v"],
            ex["delta"],
            mutable=[TAP_INPUTS],
        )
        return out, state[TAP_INPUTS]

    return loss, tapped, params, {"x": x, "v": v, "delta": deltas}


def _exact_twice_norms(data) -> np.ndarray:
    """||g_i|| = delta ||x_i^T v_i|| in float64."""
    x, v = data["x"].astype(np.float64), data["v"].astype(np.float64)
    products = np.einsum("ntd,nte->nde", x, v)
    return data["delta"] * np.sqrt(np.sum(np.square(products), axis=(1, 2)))


def test_cancelling_cross_terms_stay_within_the_clip_norm(monkeypatch):
    """A ghost norm that cancels: computed in float32 it is off by far more than its own size,
    and without the bound's slack the released contribution exceeds C."""
    loss, tapped, params, data = _twice()
    n = len(data["x"])
    clip = float(0.1 * _exact_twice_norms(data).min())  # a tenth of the smallest norm

    def released_norms():
        shaped = {k: jnp.asarray(a).reshape(1, n, *a.shape[1:]) for k, a in data.items()}
        fn = jax.jit(dp_train.make_clipped_grad_sum(loss, clip, tapped_loss_fn=tapped))
        out = []
        for i in range(n):
            total = fn(params, {}, shaped, jnp.zeros((1, n)).at[0, i].set(1))[0]
            leaves = jax.tree.leaves(total)
            out.append(np.sqrt(sum(np.sum(np.square(np.asarray(t, np.float64))) for t in leaves)))
        return np.array(out)

    norms = released_norms()
    assert np.all(norms <= clip), norms / clip - 1
    # Clipped hard (to a few % of C here): the worst-case slack is large against a norm
    # that cancels to delta^2 of its terms; only such examples pay that much.
    assert np.all(norms > 0.01 * clip)
    # The same step with the bound's gamma set to 0: the float32 ghost norm understates.
    monkeypatch.setattr(clip_rounding, "gamma", lambda k: 0.0)
    assert np.any(released_norms() > clip * (1 + 1e-4))


def test_the_bound_counts_every_rounding_of_a_small_graph(monkeypatch):
    """The chain lengths the bound passes to gamma, against the roundings counted by hand.

    One weight W (64 x 64) used twice, 16 tokens per use, a microbatch of 4. A term of a
    k-term sum passes through at most k - 1 roundings (Higham 2002, 3.1); the bound may
    count more, never fewer. The cancelling test above still passes with these counts
    undercounted 100 times (its slack is that large); this one does not.
    """
    loss, tapped, params, data = _twice()
    micro, n, d_in, d_out, uses = 4, 16, 64, 64, 2
    calls = []
    gamma = clip_rounding.gamma
    monkeypatch.setattr(clip_rounding, "gamma", lambda k: calls.append(k) or gamma(k))
    batch = {k: jnp.asarray(v[:micro]) for k, v in data.items()}
    real = jnp.ones(micro, bool)
    jax.eval_shape(
        lambda p, b: ghost_clipping.clipped_sum(tapped, p, {}, b, real, 1.0), params, batch
    )
    # A Gram pair's cross terms: an entry of each Gram matrix (d - 1 additions), their
    # product, the n x n sum in two stages; their bound gamma P_u P_v needs P_u and P_v as
    # computed to be upper bounds, so their roundings count too: each row's squares, sum and
    # square root (d + 1) for A and B, the product of the two norms, the sum over n rows.
    gram = (d_in - 1) + (d_out - 1) + 1 + 2 * (n - 1)
    spread = (d_in + 1) + (d_out + 1) + 1 + (n - 1)
    pair = gram + 2 * spread
    # The clipped sum of W per example: a use's product over its rows, the uses added, the
    # product by the clip factor, then the additions into the microbatch's buffer.
    summed = (n - 1) + (uses - 1) + 1 + (micro - 1)
    squares = 3 - 1  # the three Gram pairs' terms (u, u), (u, v), (v, v) added
    positive = micro  # a materialised array's sum: the clip factor's product, micro - 1 adds
    wants = sorted([positive, squares, summed, pair, pair, pair])
    assert len(calls) == len(wants), calls
    assert all(got >= want for got, want in zip(sorted(calls), wants, strict=True)), (
        sorted(calls),
        wants,
    )
    assert all(gamma(k) >= k * 2.0**-23 for k in calls)  # and gamma itself: u = 2^-23


@pytest.mark.parametrize(
    "model, book_keeping",
    [
        ("twice", "per_example"),
        ("twice", "batched"),
        ("t5", "per_example"),
        ("llama", "per_example"),
    ],
)
def test_removing_an_example_changes_the_sum_by_its_own_contribution(model, book_keeping):
    """Neighbouring microbatches (example i masked out) differ by i's contribution as
    released alone, up to the rounding of adding contributions: 2 gamma_m sum_j ||X_j||.

    `_twice`: the examples' ghost terms cancel (P_j ~ 1000 ||G_j||). Bu et al.'s batched
    product adds all examples' per-token terms in one sum, so removing one example moves the
    rounding of the others' terms, by far more than that: the control. T5 (a tied
    embedding: products and lookups of one table) and Llama (a lookup-only embedding, summed
    into the buffer directly) check the per-example sums of every kind of use.
    """
    if model == "twice":
        _, tapped, params, data = _twice()
        frozen, clip = {}, float(0.1 * _exact_twice_norms(data).min())
    else:
        family, params, data = _t5(0) if model == "t5" else _llama(0)
        tapped, clip = family.tapped_loss_fn(), 0.05
        params, frozen = split_trainable(params, lora=False)
    n = len(data["delta" if model == "twice" else "targets"])
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    fn = jax.jit(
        lambda r: ghost_clipping.clipped_sum(
            tapped, params, frozen, batch, r, clip, book_keeping=book_keeping
        )[0]
    )

    def released(real) -> np.ndarray:
        leaves = jax.tree.leaves(fn(jnp.asarray(real)))
        return np.concatenate([np.asarray(x, np.float64).ravel() for x in leaves])

    alone = [released(np.arange(n) == i) for i in range(n)]
    full = released(np.ones(n, bool))
    errors = [np.linalg.norm(full - released(np.arange(n) != i) - alone[i]) for i in range(n)]
    bound = 2 * clip_rounding.gamma(n) * sum(np.linalg.norm(x) for x in alone)
    if book_keeping == "per_example":
        assert max(errors) <= bound, max(errors) / bound
    else:
        assert max(errors) > 4 * bound, max(errors) / bound

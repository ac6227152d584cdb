"""What the rounding bound of the clip norms costs, and what the Book-Keeping sums' form costs.

The DP step clips example i by c_i = min(1, C / N_i), with N_i an upper bound of its gradient
norm that covers float32 rounding (`synthgen.clip_rounding`). The larger N_i is than the true
norm, the harder the example is clipped (a clip norm C / (1 + eta) in effect; no noise
changes). This prints eta = N_i / ||g_i|| - 1 for the ghost path (the default) and the vmap
path, at a T5 preset's dimensions, random weights and random tokens, against the norm of the
per-example gradient computed in float64 on the host.

It then prints, for one microbatch of `--microbatch` examples, how much removing one example
may move the rounding of the others' contributions (the worst case, in units of C, every
example clipped), for the two forms of the ghost path's sums (`ghost_clipping.clipped_sum`):

* ``per_example`` (the default): each example's contribution formed on its own, then added:
  2 gamma_m sum_j ||c_j G_j|| <= 2 gamma_m m C;
* ``batched`` (Bu et al. 2023): one product over the microbatch's examples and tokens per
  weight: 2 gamma_{m n} sum_j c_j P_j over the ghost-normed weights, P_j = sum_t ||a_t|| ||b_t||.

With `--timing`, the clipped gradient sum of one physical batch of `--examples` examples in
microbatches of `--microbatch` (`dp_train.make_clipped_grad_sum`, the part of the DP step
where the two forms differ; the noise and Adafactor are the same) is compiled for each form,
then run `--steps` times each, alternating, in this one process: seconds per call.

    python scripts/bench_clip_bound.py --preset small --input-len 128 --target-len 32
    python scripts/bench_clip_bound.py --preset small --input-len 64 --target-len 16 \\
        --examples 16 --microbatch 8 --timing --steps 5
    python scripts/bench_clip_bound.py --preset tiny --dtype bfloat16 --timing   # smoke run
"""

from __future__ import annotations

import argparse
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from synthgen import clip_rounding, dp_train, ghost_clipping
from synthgen.generator_models import T5Family
from synthgen.models.t5 import T5, T5Config


def _float64_norms(family: T5Family, params, batch) -> np.ndarray:
    """||g_i|| of each example's gradient (float32 model), summed in float64."""
    grad = jax.jit(jax.grad(family.loss_fn()))
    norms = []
    for i in range(len(batch["targets"])):
        g = grad(params, {}, {k: v[i] for k, v in batch.items()})
        squares = sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(g))
        norms.append(np.sqrt(squares))
    return np.array(norms)


def _neighbour_rounding(family: T5Family, params, batch, norms) -> tuple[float, float]:
    """(per_example, batched): the worst change of the others' rounding, in units of C.

    Every example clipped (c_j = C / N_j, N_j the step's bound): per weight, the batched
    product's entries are off by at most gamma_{m n} sum_j c_j sum_t |a_t| |b_t|^T, whose
    Frobenius norm is at most gamma_{m n} sum_j c_j P_j; removing an example changes that
    error by at most twice it (`ghost_clipping.clipped_sum`).
    """
    micro = len(norms)
    _, _, factors = jax.jit(
        lambda p, b: ghost_clipping.per_example_factors(family.tapped_loss_fn(), p, {}, b)
    )(params, batch)
    squares = 0.0
    for pairs in factors.values():
        if len(pairs) == 1 and pairs[0][0].ndim == 4:
            ((a, b),) = pairs
            if not ghost_clipping.uses_ghost_norm(a.shape[2], a.shape[3], b.shape[3]):
                continue  # materialised: summed per example on both forms
        spread = sum(np.asarray(ghost_clipping._spread(a, b).spread, np.float64) for a, b in pairs)
        tokens = sum(b.shape[2] for _, b in pairs)
        gamma = clip_rounding.gamma(micro * tokens + len(pairs) + 2)
        squares += (2 * gamma * np.sum(spread / norms)) ** 2
    return 2 * clip_rounding.gamma(micro) * micro, float(np.sqrt(squares))


def _timing(family: T5Family, params, batch, micro: int, steps: int) -> None:
    """Seconds per clipped gradient sum of the physical batch, per_example vs batched."""
    n = len(batch["targets"])
    shaped = {k: v.reshape(n // micro, micro, *v.shape[1:]) for k, v in batch.items()}
    mask = jnp.ones((n // micro, micro), jnp.float32)
    fns = {}
    for form in ghost_clipping.BOOK_KEEPING:
        fn = dp_train.make_clipped_grad_sum(
            family.loss_fn(), 0.1, tapped_loss_fn=family.tapped_loss_fn(), book_keeping=form
        )
        start = time.perf_counter()
        fns[form] = jax.jit(fn).lower(params, {}, shaped, mask).compile()
        print(f"{form:12s} compile {time.perf_counter() - start:.1f} s")
        jax.block_until_ready(fns[form](params, {}, shaped, mask))  # warm-up
    seconds = {form: [] for form in fns}
    for _ in range(steps):
        for form, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params, {}, shaped, mask))
            seconds[form].append(time.perf_counter() - start)
    for form, s in seconds.items():
        print(f"{form:12s} median {np.median(s):.3f} s  min {min(s):.3f} s  ({steps} calls)")
    ratio = np.median(seconds["per_example"]) / np.median(seconds["batched"])
    print(f"per_example_vs_batched={ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--examples", type=int, default=4)
    parser.add_argument("--microbatch", type=int, default=None, help="default: --examples")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--target-len", type=int, default=32)
    parser.add_argument("--timing", action="store_true", help="time the two forms of the sums")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    micro = args.microbatch or args.examples
    if args.examples % micro:
        raise SystemExit(f"--examples must be a multiple of --microbatch, got {micro=}")

    cfg = T5Config.preset(args.preset, dtype=args.dtype)
    family = T5Family(cfg, tokenizer=None)
    rng = np.random.default_rng(0)
    n = args.examples
    ids = rng.integers(2, cfg.vocab_size, size=(n, args.input_len), dtype=np.int32)
    targets = rng.integers(2, cfg.vocab_size, size=(n, args.target_len), dtype=np.int32)
    batch = {
        "input_ids": jnp.asarray(ids),
        "input_mask": jnp.ones(ids.shape, jnp.float32),
        "targets": jnp.asarray(targets),
        "target_mask": jnp.ones(targets.shape, jnp.float32),
    }
    params = T5(cfg).init(jax.random.key(0), ids[:1], np.ones_like(ids[:1]), targets[:1])
    params = params["params"]
    first = {k: v[:micro] for k, v in batch.items()}
    real = jnp.ones(micro, bool)
    ghost = jax.jit(
        lambda p, b: ghost_clipping.clipped_sum(family.tapped_loss_fn(), p, {}, b, real, 1.0)[2]
    )
    vmap = jax.jit(lambda p, b: dp_train._vmap_clipped_sum(family.loss_fn(), 1.0)(p, {}, b, real))
    exact = _float64_norms(family, params, first)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"T5 {args.preset} {args.dtype}, microbatch of {micro} examples of {args.input_len}/"
        f"{args.target_len} tokens, {jax.devices()[0].platform}, commit {commit or 'unknown'} "
        "(plus the working tree's changes, if any); eta = N / ||g||_float64 - 1"
    )
    ghost_norms = np.asarray(ghost(params, first), np.float64)
    for name, norms in (
        ("ghost (default)", ghost_norms),
        ("vmap", np.asarray(vmap(params, first)[2], np.float64)),
    ):
        eta = norms / exact - 1
        print(
            f"{name:16s} eta min {eta.min():.2e}  median {np.median(eta):.2e}  max {eta.max():.2e}"
        )
    per_example, batched = _neighbour_rounding(family, params, first, ghost_norms)
    print(
        "removing one example moves the others' rounding by at most, in units of C: "
        f"per_example {per_example:.2e}  batched {batched:.2e}"
    )
    if args.timing:
        _timing(family, params, batch, micro, args.steps)


if __name__ == "__main__":
    main()

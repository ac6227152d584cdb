"""What the rounding bound of the clip norms costs: eta = N_bound / ||g|| - 1 per example.

The DP step clips example i by c_i = min(1, C / N_i), with N_i an upper bound of its gradient
norm that covers float32 rounding (`synthgen.clip_rounding`). The larger N_i is than the true
norm, the harder the example is clipped (a clip norm C / (1 + eta) in effect; no noise
changes). This prints eta for the ghost path (the default) and the vmap path, at a T5
preset's dimensions, random weights and random tokens, against the norm of the per-example
gradient computed in float64 on the host.

    python scripts/bench_clip_bound.py --preset small --input-len 128 --target-len 32
    python scripts/bench_clip_bound.py --preset tiny --dtype bfloat16   # smoke run
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from synthgen import dp_train, ghost_clipping
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--examples", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--target-len", type=int, default=32)
    args = parser.parse_args()

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
    real = jnp.ones(n, bool)
    ghost = jax.jit(
        lambda p, b: ghost_clipping.clipped_sum(family.tapped_loss_fn(), p, {}, b, real, 1.0)[2]
    )
    vmap = jax.jit(lambda p, b: dp_train._vmap_clipped_sum(family.loss_fn(), 1.0)(p, {}, b, real))
    exact = _float64_norms(family, params, batch)
    print(
        f"T5 {args.preset} {args.dtype}, {n} examples of {args.input_len}/{args.target_len} "
        f"tokens, {jax.devices()[0].platform}; eta = N / ||g||_float64 - 1"
    )
    for name, fn in (("ghost (default)", ghost), ("vmap", lambda p, b: vmap(p, b)[2])):
        eta = np.asarray(fn(params, batch), np.float64) / exact - 1
        print(
            f"{name:16s} eta min {eta.min():.2e}  median {np.median(eta):.2e}  max {eta.max():.2e}"
        )


if __name__ == "__main__":
    main()

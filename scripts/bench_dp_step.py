"""Examples/s of one training step at t5-small size: non-private, our DP step, jax_privacy.

All three steps do the same work around the gradient: T5 forward/backward on a batch of
`--batch` (document, query) pairs, then an Adafactor update. They differ in the gradient:

* non-private: `value_and_grad` of the batch-mean loss (one batched backward pass);
* ours, vmap: `synthgen.dp_train`'s per-example path (per-example gradients by `vmap` over
  microbatches inside `lax.scan`, clipping after the vmap) plus Gaussian noise;
* ours, ghost (the default): per-example norms by ghost clipping / Book-Keeping
  (`synthgen.ghost_clipping`), same microbatches, plus the same noise;
* jax_privacy: `jax_privacy.clipped_grad` (its clip-inside-vmap) plus the same noise.

It also times drawing the noise alone (one N(0, 1) per parameter, a cost every DP step pays
whatever its clipping) and prints the ghost step's ratio without it.

Random init, random tokens (speed only). Every step is jitted and timed after a compile
and warm-up step; ratios are taken within this one run (the machine is noisy). The last line
is exactly ``dp_vs_nonprivate=<ratio> dp_vs_jax_privacy=<ratio>`` (ours = the ghost step).

    python scripts/bench_dp_step.py            # t5-small dims, batch 16 (minutes on 2 cores)
    python scripts/bench_dp_step.py --batch 64 --microbatch 16 --skip-jax-privacy
    python scripts/bench_dp_step.py --preset tiny --steps 2   # smoke run
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from synthgen import dp_train
from synthgen.generator_models import T5Family, token_nll
from synthgen.models.t5 import T5, T5Config, shift_right

CLIP, SIGMA, LR = 0.1, 1.0, 1e-3


def _data(cfg: T5Config, batch: int, input_len: int, target_len: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, cfg.vocab_size, size=(batch, input_len), dtype=np.int32)
    tgt = rng.integers(2, cfg.vocab_size, size=(batch, target_len), dtype=np.int32)
    tgt[:, -1] = cfg.eos_token_id
    ones = lambda a: np.ones(a.shape, np.float32)  # noqa: E731
    return {"input_ids": ids, "input_mask": ones(ids), "targets": tgt, "target_mask": ones(tgt)}


def _time(step, state, reps: int) -> float:
    """Seconds per step: one compile + warm-up call, then `reps` timed calls."""
    state = step(*state)
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(reps):
        state = step(*state)
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / reps


def nonprivate_step(cfg: T5Config, optimizer, microbatch: int | None = None):
    """The batch-mean gradient in one pass, or accumulated over `microbatch`-sized chunks."""
    module = T5(cfg)

    def batch_loss(params, batch):
        decoder_in = shift_right(batch["targets"], cfg.decoder_start_token_id, cfg.pad_token_id)
        logits = module.apply(
            {"params": params},
            batch["input_ids"],
            batch["input_mask"],
            decoder_in,
            batch["target_mask"],
        )
        return jax.vmap(token_nll)(logits, batch["targets"], batch["target_mask"]).mean()

    def accumulated(params, batch):
        size = len(batch["input_ids"])
        chunks = jax.tree.map(
            lambda x: x.reshape(size // microbatch, microbatch, *x.shape[1:]), batch
        )

        def add(total, chunk):
            grads = jax.grad(batch_loss)(params, chunk)
            return jax.tree.map(jnp.add, total, grads), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        total, _ = jax.lax.scan(add, zeros, chunks)
        return jax.tree.map(lambda g: g / (size // microbatch), total)

    @jax.jit
    def step(params, opt_state, batch, key):
        if microbatch is None:
            grads = jax.grad(batch_loss)(params, batch)
        else:
            grads = accumulated(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, batch, key

    return step


def dp_step(
    family: T5Family, optimizer, batch_size: int, microbatch: int, ghost: bool, rule: str = "auto"
):
    tapped = family.tapped_loss_fn() if ghost else None
    grad_sum = dp_train.make_clipped_grad_sum(
        family.loss_fn(), CLIP, tapped_loss_fn=tapped, norm_rule=rule
    )
    update = dp_train.make_noisy_update(
        optimizer, clip_norm=CLIP, noise_multiplier=SIGMA, expected_batch=batch_size
    )
    num_micro = batch_size // microbatch

    @jax.jit
    def step(params, opt_state, batch, key):
        shaped = jax.tree.map(lambda x: x.reshape(num_micro, microbatch, *x.shape[1:]), batch)
        mask = jnp.ones((num_micro, microbatch), jnp.float32)
        total, _, _ = grad_sum(params, {}, shaped, mask)
        key, sub = jax.random.split(key)
        params, opt_state = update(params, opt_state, total, sub)
        return params, opt_state, batch, key

    return step


def jax_privacy_step(family: T5Family, optimizer, batch_size: int):
    from jax_privacy import clipped_grad

    loss = family.loss_fn()

    def example_loss(params, batch):
        # clipped_grad keeps a batch axis of 1 per example (keep_batch_dim=True).
        return loss(params, {}, jax.tree.map(lambda x: x[0], batch))

    grad_fn = clipped_grad(example_loss, l2_clip_norm=CLIP, batch_argnums=1)
    update = dp_train.make_noisy_update(
        optimizer, clip_norm=CLIP, noise_multiplier=SIGMA, expected_batch=batch_size
    )

    @jax.jit
    def step(params, opt_state, batch, key):
        total = grad_fn(params, batch)
        key, sub = jax.random.split(key)
        params, opt_state = update(params, opt_state, total, sub)
        return params, opt_state, batch, key

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", help="T5 preset (t5-small dims)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--microbatch", type=int, default=None, help="ours: examples per vmap (min(16, batch))"
    )
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--target-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per method")
    parser.add_argument("--skip-jax-privacy", action="store_true")
    parser.add_argument(
        "--norm-rule",
        default="auto",
        choices=("auto", "ghost", "materialise"),
        help="ours: how weights used once by a product take their norms",
    )
    args = parser.parse_args()
    args.microbatch = args.microbatch or min(16, args.batch)
    if args.batch % args.microbatch:
        parser.error("--batch must be a multiple of --microbatch")

    cfg = T5Config.preset(args.preset)
    family = T5Family(cfg, tokenizer=None)
    batch = {
        k: jnp.asarray(v)
        for k, v in _data(cfg, args.batch, args.input_len, args.target_len).items()
    }
    ids = batch["input_ids"][:1]
    params = T5(cfg).init(jax.random.key(0), ids, jnp.ones_like(ids), ids)["params"]
    n_params = sum(x.size for x in jax.tree.leaves(params))
    optimizer = dp_train.make_optimizer(LR, lora=False)
    print(
        f"T5 {args.preset}: {n_params / 1e6:.1f}M parameters, d_model={cfg.d_model}, "
        f"layers={cfg.num_layers}+{cfg.num_decoder_layers}, vocab={cfg.vocab_size}, "
        f"batch={args.batch}, input={args.input_len}, target={args.target_len}, "
        f"devices={jax.device_count()} x {jax.devices()[0].platform}"
    )

    def run(name, step):
        state = (params, optimizer.init(params), batch, jax.random.key(1))
        seconds = _time(step, state, args.steps)
        rate = args.batch / seconds
        print(f"{name:34s} {seconds:8.2f} s/step {rate:8.2f} examples/s", flush=True)
        return rate

    nonprivate = run("non-private (batched grad)", nonprivate_step(cfg, optimizer))
    if args.microbatch < args.batch:
        accumulated = run(
            f"non-private (accumulated over {args.microbatch})",
            nonprivate_step(cfg, optimizer, args.microbatch),
        )
    else:
        accumulated = nonprivate
    leaves = [x.shape for x in jax.tree.leaves(params)]
    draw = jax.jit(
        lambda key: [
            jax.random.normal(k, s) for k, s in zip(jax.random.split(key, len(leaves)), leaves)
        ]
    )
    jax.block_until_ready(draw(jax.random.key(2)))
    start = time.perf_counter()
    for i in range(args.steps):
        jax.block_until_ready(draw(jax.random.key(3 + i)))
    noise_s = (time.perf_counter() - start) / args.steps
    print(f"{'Gaussian noise alone':34s} {noise_s:8.2f} s/step", flush=True)
    vmap = run(
        f"dpsynth DP vmap (microbatch {args.microbatch})",
        dp_step(family, optimizer, args.batch, args.microbatch, ghost=False),
    )
    ours = run(
        f"dpsynth DP ghost (microbatch {args.microbatch}, {args.norm_rule})",
        dp_step(family, optimizer, args.batch, args.microbatch, ghost=True, rule=args.norm_rule),
    )
    if args.skip_jax_privacy:
        reference = float("nan")
    else:
        reference = run(
            "jax_privacy.clipped_grad DP", jax_privacy_step(family, optimizer, args.batch)
        )
    ghost_s = args.batch / ours
    without_noise = (args.batch / nonprivate) / (ghost_s - noise_s)
    print(
        f"vmap_vs_nonprivate={vmap / nonprivate:.3f} ghost_vs_vmap={ours / vmap:.3f} "
        f"ghost_without_noise_vs_nonprivate={without_noise:.3f} "
        f"ghost_vs_accumulated_nonprivate={ours / accumulated:.3f}"
    )
    print(f"dp_vs_nonprivate={ours / nonprivate:.3f} dp_vs_jax_privacy={ours / reference:.3f}")


if __name__ == "__main__":
    main()

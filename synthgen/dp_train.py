"""DP-Adafactor training: per-example clipping, Gaussian noise, Adafactor; resumable, sharded.

One step (Abadi et al. 2016): a Poisson batch (`BatchSampler`); per-example gradients
clipped to L2 norm C and summed (`make_clipped_grad_sum`); N(0, (sigma C)^2 I) added and
the sum divided by the *expected* batch size B (the realised one is private); Adafactor
(Carranza et al. 2023). See docs/guides/querygen.md.

Privacy:
  Unit: one training example. Poisson sampling: add/remove-one, a Poisson-subsampled
  Gaussian mechanism of multiplier sigma; fixed-size "shuffle": replace-one
  (`synthgen.privacy.accounting`). The clipped sum's sensitivity is C (each contribution, as
  summed, is at most C; removing one also moves how the others round where they are added,
  at most 2 gamma_k B C for k additions, as in every floating-point DP-SGD:
  `make_clipped_grad_sum`). A non-finite per-example gradient contributes 0. The accountant
  reads the same `DPConfig` as the sampler. The run is charged before the first step,
  exactly once across crashes and resumes (`synthgen.work_folder`). The noise key and the
  sampler seed come from a 128-bit run seed (`synthgen.run_seed`) and stay, with the resume
  state, in the private work folder. The progress bar shows steps and epsilon only
  (`PROGRESS_FORMAT`); the losses and non-finite counts of `TrainResult` are NOT DP: for
  the caller only, never written to outputs or metadata.

References: Abadi et al. 2016 (DP-SGD); Carranza et al. 2023 (DP-Adafactor for query
generation); Shazeer & Stern 2018 (Adafactor).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from synthgen import clip_rounding, ghost_clipping, run_seed
from synthgen.batching import BatchSampler
from synthgen.dp_plan import PER_EXAMPLE_NORMS, DPConfig, PrivacyPlan, plan_privacy
from synthgen.privacy.errors import PrivacyError
from synthgen.privacy.receipts import Payer, paid
from synthgen.privacy.rng import secure_rng
from synthgen.work_folder import OncePayer, WorkFolder, plan_record

# Re-exported: the plan of a run lives in `synthgen.dp_plan`, which `synthgen.work_folder`
# imports too; callers keep importing it from here.
__all__ = [
    "PER_EXAMPLE_NORMS",
    "ClipCounts",
    "DPConfig",
    "PrivacyPlan",
    "TrainResult",
    "make_clipped_grad_sum",
    "make_noisy_update",
    "make_optimizer",
    "plan_privacy",
    "train",
]

PyTree = Any
LossFn = Callable[[PyTree, PyTree, dict[str, jax.Array]], jax.Array]
# ---- the jitted pieces ----------------------------------------------------------------------


class ClipCounts(NamedTuple):
    """Per-chunk counts of the clipping step (from private data: NOT DP, operator only)."""

    clipped: jax.Array  # real examples whose norm bound (`synthgen.clip_rounding`) exceeded C
    nonfinite: jax.Array  # real examples whose gradient had an inf or NaN (zeroed)


def _vmap_clipped_sum(loss_fn: LossFn, clip_norm: float):
    """The per-example path: vmap(grad) materialises every example's gradient, then clips."""
    per_example = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, None, 0))

    def clipped_sum(trainable, frozen, batch, real):
        losses, grads = per_example(trainable, frozen, batch)
        micro = real.shape[0]
        # The materialised gradients, checked, zeroed where not kept and fenced by barriers.
        leaves = [g.astype(jnp.float32) for g in jax.tree.leaves(grads)]
        leaves, keep = ghost_clipping.keep_finite(leaves, real)
        with jax.named_scope(ghost_clipping.CLIP_SCOPE):
            squares, chain, entries = clip_rounding.sum_of_squares(leaves, micro)
            zeros = jnp.zeros_like(squares)
            norms = clip_rounding.clip_norm_bound(
                squares,
                zeros + clip_rounding.TINY * entries,
                squares,
                zeros,
                norm_eps=clip_rounding.gamma(chain + 4),
                sum_eps_positive=clip_rounding.gamma(micro + 2),
                sum_eps_cross=0.0,
                sum_tiny=clip_rounding.TINY * micro * sum(math.sqrt(g[0].size) for g in leaves),
            )
            factors = ghost_clipping.clip_factors(keep, norms, clip_norm)
            sums = [clip_rounding.exact_einsum("b,b...->...", factors, g) for g in leaves]
        total = jax.tree.unflatten(jax.tree.structure(grads), sums)
        return total, losses, norms, keep

    return clipped_sum


def make_clipped_grad_sum(
    loss_fn: LossFn,
    clip_norm: float,
    *,
    tapped_loss_fn: ghost_clipping.TappedLossFn | None = None,
    norm_rule: ghost_clipping.NormRule = "auto",
    book_keeping: ghost_clipping.BookKeeping = "per_example",
):
    """Returns f(trainable, frozen, batch, mask) -> (sum of clipped grads, loss sum, ClipCounts).

    `batch` leaves are [num_micro, micro, ...] and `mask` [num_micro, micro]; a scan runs
    over the microbatches. With `tapped_loss_fn` (the loss with `LoraDense` taps) a
    microbatch is clipped by `ghost_clipping.clipped_sum` (`norm_rule`, `book_keeping`);
    without it, by `vmap(grad)` over the examples, clipping after the vmap.

    Privacy:
      Each real example (mask 1) contributes min(1, C / N) g, of L2 norm at most C: N bounds
      ||g|| from above including its rounding, with exact-input products and float32
      accumulation on every device (`synthgen.clip_rounding`). A non-finite gradient and a
      padding row contribute exactly 0, so no example can make the sum NaN or inf: the
      sensitivity is C (add/remove-one) up to the rounding of adding the contributions,
      which an example's removal moves by at most 2 gamma_k sum_j ||c_j g_j|| <= 2 gamma_k B C
      over its k additions (microbatch, microbatches, chunks): 2.4e-4 C within a microbatch
      of 32, at most 0.011 C over the `gpu` preset's batch of 1024 (k = 44). Every
      floating-point DP-SGD has this residual (Mironov 2012); the noise is not calibrated for
      it. Both paths compute the same sum to float rounding (tested).
    """
    if tapped_loss_fn is None:
        clipped_sum = _vmap_clipped_sum(loss_fn, clip_norm)
    else:

        def clipped_sum(trainable, frozen, batch, real):
            return ghost_clipping.clipped_sum(
                tapped_loss_fn, trainable, frozen, batch, real, clip_norm, norm_rule, book_keeping
            )

    def micro_step(carry, inputs):
        trainable, frozen, acc, loss_sum, clipped, nonfinite = carry
        batch, mask = inputs
        real = mask > 0
        total, losses, norms, keep = clipped_sum(trainable, frozen, batch, real)
        acc = jax.tree.map(jnp.add, acc, total)
        loss_ok = keep & jnp.isfinite(losses)
        loss_sum = loss_sum + jnp.sum(jnp.where(loss_ok, losses, 0.0))
        clipped = clipped + jnp.sum(keep & (norms > clip_norm))
        nonfinite = nonfinite + jnp.sum(real & ~keep)
        return (trainable, frozen, acc, loss_sum, clipped, nonfinite), None

    def clipped_grad_sum(trainable, frozen, batch, mask):
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable)
        count = jnp.int32(0)
        init = (trainable, frozen, zeros, jnp.float32(0), count, count)
        (_, _, acc, loss_sum, clipped, nonfinite), _ = jax.lax.scan(micro_step, init, (batch, mask))
        return acc, loss_sum, ClipCounts(clipped, nonfinite)

    return clipped_grad_sum


def make_noisy_update(
    optimizer: optax.GradientTransformation,
    *,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch: int,
):
    """Returns f(trainable, opt_state, grad_sum, key) -> (trainable, opt_state).

    Privacy: adds N(0, (noise_multiplier * clip_norm)^2) to every coordinate of the clipped
    sum, then divides by the expected batch size (a public constant).
    """
    std = noise_multiplier * clip_norm

    def update(trainable, opt_state, grad_sum, key):
        leaves, treedef = jax.tree.flatten(grad_sum)
        keys = jax.random.split(key, len(leaves))
        noisy = [
            (g + std * jax.random.normal(k, g.shape, jnp.float32)) / expected_batch
            for g, k in zip(leaves, keys, strict=True)
        ]
        grads = jax.tree.unflatten(treedef, noisy)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trainable)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state

    return update


def make_optimizer(learning_rate: float, *, lora: bool) -> optax.GradientTransformation:
    """Adafactor. For LoRA, `multiply_by_parameter_scale=False`: B starts at 0 and a
    parameter-scaled update would leave it at 0 forever."""
    return optax.adafactor(learning_rate, multiply_by_parameter_scale=not lora)


# ---- the loop ---------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    """Output of `train`: trained parameters, the guarantee, and the per-step log.

    `losses` (each step's mean loss) and `nonfinite` (zeroed per-example gradients) are
    computed on private data and NOT DP: for the operator only, never for released files.
    """

    trainable: PyTree
    plan: PrivacyPlan
    losses: list[float]
    steps_run: int
    resumed_from: int
    seconds: float
    nonfinite: int = 0


def _charge_on_process_0(charge: Callable[[], object]) -> None:
    """Runs `charge` once per run: on process 0 only when there are several processes.

    The other processes learn whether it succeeded (a broadcast flag) and stop with a
    `PrivacyError` when it did not, so no process draws noise for a refused run and a run of
    k processes is charged once, not k times.
    """
    if jax.process_count() == 1:
        charge()
        return
    from jax.experimental import multihost_utils

    error = None
    if jax.process_index() == 0:
        try:
            charge()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the broadcast
            error = exc
    ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if error is not None:
        raise error
    if not ok:
        raise PrivacyError("process 0 could not charge the run to the ledger; nothing is released")


@functools.partial(jax.jit, donate_argnums=0)
def _add_trees(total: PyTree, more: PyTree) -> PyTree:
    """The chunks' clipped sums added in one dispatch (leaf by leaf, it is one per leaf)."""
    return jax.tree.map(jnp.add, total, more)


def train(
    loss_fn: LossFn,
    trainable: PyTree,
    frozen: PyTree,
    data: dict[str, np.ndarray],
    config: DPConfig,
    *,
    lora: bool = False,
    work_dir: str | Path | None = None,
    pay: Payer | None = None,
    description: str = "",
    progress: bool = True,
    stop_after: int | None = None,
    plan: PrivacyPlan | None = None,
    fixed_rate: bool = False,
    tapped_loss_fn: ghost_clipping.TappedLossFn | None = None,
) -> TrainResult:
    """Runs DP-Adafactor on `data` (arrays with a leading example axis).

    Args:
      loss_fn: per-example loss(trainable, frozen, example) -> scalar. No batch statistics.
      trainable: parameters to train (all, or the LoRA adapters).
      frozen: parameters held fixed (passed to `loss_fn`, never updated).
      data: dict of arrays [n, ...]; row i is example i.
      config: DP hyper-parameters.
      lora: selects the Adafactor variant (see `make_optimizer`).
      work_dir: the run's private work folder (`synthgen.work_folder`: checkpoints, which
        resume the run, the noise key, the sampler state and the charge record). Keep it
        secret; the caller deletes it once the release is written.
      pay: the caller's payer (`synthgen.privacy.receipts`), paid once before the first
        noise; with a work folder, that folder's `WorkFolder.payer` (a resume pays
        nothing more). None: an uncharged run (tests, audits that state their own claim).
      description: public description for the ledger (ids and parameters only).
      progress: show a progress bar (steps and epsilon so far).
      stop_after: stop after this many steps in total (to test resumption).
      plan: the run's privacy plan if already computed by `plan_privacy(config, n)`.
      fixed_rate: `plan` may be made for more examples than `data` has; each example is
        drawn at the plan's Poisson rate, so the mechanism does not depend on the data's
        size (audits, whose size depends on the canaries inserted).
      tapped_loss_fn: `loss_fn` with `LoraDense` taps (the families' `tapped_loss_fn()`):
        with `config.per_example_norms == "ghost"`, ghost clipping (the same sum, faster).

    Returns:
      TrainResult with the final trainable parameters and the privacy plan.

    Raises:
      ValueError: bad shapes; a work folder of another run, ledger or scope; a payer with
        a non-private run, or not the work folder's.
      BudgetExceededError: the run's charge would exceed the scope's cap (nothing drawn).

    Privacy:
      The subsampled Gaussian mechanism of `plan.event` under `plan.relation` (module
      docstring), charged before the first noise is drawn.
    """
    sizes = {len(v) for v in data.values()}
    if len(sizes) != 1:
        raise ValueError(f"all data arrays need the same number of rows, got {sorted(sizes)}")
    n = sizes.pop()
    if plan is None:
        plan = plan_privacy(config, n)
    elif plan.batch_size != config.batch_size or (
        plan.num_examples != n if not fixed_rate else n > plan.num_examples
    ):
        raise ValueError("the privacy plan was made for another dataset or batch size")
    if plan.sampling != config.sampling:  # the batches drawn must be those accounted for
        raise ValueError(
            f"the privacy plan accounts for {plan.sampling} sampling, the run would draw "
            f"{config.sampling} batches"
        )
    if fixed_rate and (plan.sampling != "poisson" or config.sampling != "poisson"):
        raise ValueError("fixed_rate needs Poisson sampling")
    devices = jax.device_count()
    if config.microbatch % devices:
        raise ValueError(f"microbatch={config.microbatch} must be a multiple of {devices=}")

    if pay is not None and not plan.private:
        raise ValueError("a non-private run (noise_multiplier=0) cannot be charged to a ledger")
    description = description or f"DP-Adafactor n={n} steps={plan.steps}"

    work = None if work_dir is None else WorkFolder(work_dir)
    kept = None if work is None else work.kept_seed()  # a restarted run's first seed
    seed = run_seed.shared_seed(config.seed if kept is None else kept)
    sampler_seed, noise_key_data = run_seed.split_streams(seed)
    sampler = BatchSampler(
        n,
        config.batch_size,
        config.physical_batch,
        config.sampling,
        secure_rng(sampler_seed),
        rate=plan.sampling_rate if fixed_rate else None,
    )
    noise_key = run_seed.noise_key(noise_key_data)
    optimizer = make_optimizer(config.learning_rate, lora=lora)
    opt_state = optimizer.init(trainable)
    step = 0

    manager = None
    if work is None and isinstance(pay, OncePayer):
        raise ValueError(  # its key would hand a second run the first run's charge
            f"this payer pays once for the run kept in {pay.work.path}: pass that work_dir"
        )
    if work is not None:
        from synthgen.checkpoints import TrainCheckpoints

        if pay is None and work.charge_record() is not None:
            raise ValueError(
                f"the run in {work.path} was charged to ledger "
                f"{work.charge_record()['ledger']}: resume it with that ledger"
            )
        if pay is not None and not (
            isinstance(pay, OncePayer) and pay.work.path.resolve() == work.path.resolve()
        ):
            raise ValueError(  # any other payer would charge a resumed run again
                f"a run kept in {work.path} pays through that folder: "
                "pay=WorkFolder(work_dir).payer(ledger, scope, stage=...)"
            )
        work.create()
        work.keep_seed(seed)  # before the charge below
        manager = TrainCheckpoints(work.checkpoints)
        restored = manager.restore_latest(trainable, opt_state, noise_key_data)
        if restored is not None:
            meta = restored.meta
            if meta["plan"] != plan_record(plan):
                raise ValueError(f"checkpoint in {work.path} belongs to a different run")
            trainable, opt_state, step = restored.trainable, restored.opt_state, restored.step
            noise_key = run_seed.noise_key(restored.noise_key)
            sampler.set_state(meta["sampler"])
    resumed_from = step

    if pay is not None:  # paid before the first noise is drawn
        _charge_on_process_0(lambda: paid(pay, plan, description))

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    sharded = NamedSharding(mesh, P(None, "data"))
    # Copy: the update donates its inputs, and the caller's arrays must stay valid.
    trainable = jax.device_put(jax.tree.map(jnp.copy, trainable), replicated)
    frozen = jax.device_put(frozen, replicated)
    # Placed as the update's outputs are: with the state left uncommitted, the second step's
    # inputs differ from the first's in sharding and `update` would compile twice.
    opt_state = jax.device_put(opt_state, replicated)
    ghost = tapped_loss_fn if config.per_example_norms == "ghost" else None
    grad_sum_fn = jax.jit(make_clipped_grad_sum(loss_fn, config.clip_norm, tapped_loss_fn=ghost))
    update_fn = jax.jit(
        make_noisy_update(
            optimizer,
            clip_norm=config.clip_norm,
            noise_multiplier=plan.noise_multiplier,
            expected_batch=config.batch_size,
        ),
        donate_argnums=(0, 1),
    )
    num_micro = config.physical_batch // config.microbatch

    def to_device(indices: np.ndarray, mask: np.ndarray):
        rows = {
            k: v[indices].reshape(num_micro, config.microbatch, *v.shape[1:])
            for k, v in data.items()
        }
        return (
            jax.device_put(rows, sharded),
            jax.device_put(mask.reshape(num_micro, config.microbatch), sharded),
        )

    last = plan.steps if stop_after is None else min(plan.steps, stop_after)
    bar = _progress(plan.steps, step, progress)
    losses: list[float] = []
    start, nonfinite = time.time(), 0
    while step < last:
        indices = sampler.sample()
        total = None
        loss_sum, count = 0.0, 0
        for chunk in sampler.chunks(indices):
            batch, mask = to_device(chunk.indices, chunk.mask)
            acc, chunk_loss, counts = grad_sum_fn(trainable, frozen, batch, mask)
            total = acc if total is None else _add_trees(total, acc)
            loss_sum += float(chunk_loss)
            nonfinite += int(counts.nonfinite)
            count += int(chunk.mask.sum())
        trainable, opt_state = update_fn(
            trainable, opt_state, total, jax.random.fold_in(noise_key, step)
        )
        step += 1
        losses.append(loss_sum / max(count, 1))
        if bar is not None:
            bar.update(1)
            if step % max(1, plan.steps // 50) == 0 or step == last:
                # Steps and epsilon only: no loss (not DP), no examples/s or time per step
                # (statistics of the realised Poisson batches and of n); bars reach logs.
                bar.set_postfix_str(f"eps {plan.epsilon_after(step):.2f}")
        if manager is not None and (step % config.checkpoint_every == 0 or step == last):
            manager.save(
                step,
                trainable,
                opt_state,
                jax.random.key_data(noise_key),
                {"plan": dataclasses.asdict(plan), "sampler": sampler.state()},
            )
    if bar is not None:
        bar.close()
    if manager is not None:
        manager.close()
    return TrainResult(
        jax.device_get(trainable),
        plan,
        losses,
        step,
        resumed_from,
        time.time() - start,
        nonfinite,
    )


PROGRESS_FORMAT = "{desc}: {n_fmt}/{total_fmt} steps{postfix}"
"""The DP-SGD bar: steps and epsilon spent, nothing else (tqdm's default rate and elapsed
time depend on the realised, private, Poisson batch sizes and on n)."""


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="dp-train", bar_format=PROGRESS_FORMAT)

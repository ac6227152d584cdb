"""One training step at T5 sizes: non-private, our DP steps, jax_privacy; compile vs run.

The prepared device check of the DP step (issue 61). All steps do the same work around the
gradient: T5 forward/backward on a batch of `--batch` (document, query) pairs, then an
Adafactor update. They differ in the gradient:

* ``nonprivate``: `grad` of the batch-mean loss (one batched backward pass);
* ``nonprivate-accumulated``: the same, accumulated over `--microbatch` chunks in `lax.scan`
  (only when the microbatch is smaller than the batch);
* ``dp-vmap``: `synthgen.dp_train`'s per-example path (per-example gradients by `vmap` over
  microbatches inside `lax.scan`, clipping after the vmap) plus Gaussian noise;
* ``dp-ghost`` (the default DP step): per-example norms by ghost clipping / Book-Keeping
  (`synthgen.ghost_clipping`), same microbatches, plus the same noise;
* ``jax-privacy``: `jax_privacy.clipped_grad` (clip inside its vmap, `microbatch_size` =
  `--microbatch`) plus the same noise; "not installed" when it does not import.

Two more rows: ``noise`` draws one N(0, 1) per parameter (a cost every DP step pays whatever
its clipping), ``matmul-bf16`` times a bf16 [n x n] @ [n x n] product (the peak the MFU column
divides by; n = `--matmul-size`, 8192 on a GPU). `--variants` picks rows.

For each row: trace and compile seconds (``jax.jit(f).lower(*args)`` then ``.compile()``, each
timed), then the compiled callable is called once (warm-up) and `--steps` times (timed);
examples/s and the ratio to the non-private step; the optimised HLO's size and op census
(`hlo_census`: dots, dots that ask for exact inputs, scatters, gathers, loops, sorts, custom
calls, the largest arrays; `--hlo-dir` keeps the HLO text); XLA's ``cost_analysis()`` flops
and ``memory_analysis()`` bytes; on a GPU the device's ``peak_bytes_in_use`` and the MFU.

* XLA counts a ``while`` body once, whatever its trip count: the "GFLOP/step" column is XLA's
  count times the number of microbatches for the steps that scan over them (outside the
  scan, the optimiser and the noise are small next to it).
* MFU = model FLOPs/s over the bf16 matmul rate measured in the same run. Model FLOPs are an
  analytic count of the *non-private* training step (`model_flops_per_example`: 3 x the
  forward matmuls and attention products of T5 at these lengths; XLA's count of the
  non-private step at t5-small, 128/32 tokens, is 0.4% above it), the same numerator for
  every row: work a DP step adds (norms, clipping) is overhead, not model FLOPs.
* ``--dtype bfloat16`` computes the model's matmuls in bfloat16 (parameters stay float32),
  ``--remat`` rematerialises each T5 block in the backward pass.
* ``--aot-only`` compiles and analyses without running (abstract parameters, no
  allocation): usable on a CPU at GPU sizes, but the program, its flops and bytes are then the
  CPU's, not the GPU's.
* ``--timeout-per-variant S`` runs each row in its own process, killed after S seconds and
  reported as "timeout" (saying whether the compile had finished, and its seconds if so); the
  script goes on. A fresh process per row also makes ``peak_bytes_in_use`` per row, and keeps
  the parent off the accelerator; without it, rows share one process and the peak is
  cumulative (the table says so). ``--json FILE`` writes every figure.

Random init, random tokens (speed only); ratios are taken within one run (the machine is
noisy). The output ends with a census table, the main markdown table and then exactly
``dp_vs_nonprivate=<ratio> dp_vs_jax_privacy=<ratio>`` (ours = the ghost step; ``nan`` where a
row did not run). A JAX persistent compilation cache, if set, makes compile seconds cache
hits (the summary line says so).

    python scripts/bench_dp_step.py            # t5-small dims, batch 16 (minutes on 2 cores)
    python scripts/bench_dp_step.py --batch 64 --microbatch 16 --variants nonprivate,dp-ghost
    python scripts/bench_dp_step.py --preset base --batch 64 --microbatch 16 \\
        --input-len 384 --target-len 128 --dtype bfloat16 --aot-only --json base.json
    PYTHONPATH=. python3 scripts/bench_dp_step.py --batch 64 --timeout-per-variant 150 \\
        --variants matmul-bf16,nonprivate,dp-ghost --json small.json   # on a GPU
    python scripts/bench_dp_step.py --preset tiny --steps 2   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from synthgen import dp_train
from synthgen.generator_models import T5Family, token_nll
from synthgen.models.t5 import T5, T5Config, shift_right

CLIP, SIGMA, LR = 0.1, 1.0, 1e-3
VARIANTS = (
    "nonprivate",
    "nonprivate-accumulated",
    "noise",
    "dp-vmap",
    "dp-ghost",
    "jax-privacy",
    "matmul-bf16",
)
SCANNED = ("nonprivate-accumulated", "dp-vmap", "dp-ghost", "jax-privacy")
CENSUS_OPS = (
    "dot",
    "scatter",
    "gather",
    "while",
    "sort",
    "custom-call",
    "fusion",
)
CENSUS_EXTRA = (
    "dot_exact",
    "dot_highest",
    "dot_f32_f32_f32",
    "dot_bf16_bf16_f32",
    "gemm_calls",
    "triton_gemm",
    "control_deps",
)


# ---- the steps --------------------------------------------------------------------------------


def _data(cfg: T5Config, batch: int, input_len: int, target_len: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, cfg.vocab_size, size=(batch, input_len), dtype=np.int32)
    tgt = rng.integers(2, cfg.vocab_size, size=(batch, target_len), dtype=np.int32)
    tgt[:, -1] = cfg.eos_token_id
    ones = lambda a: np.ones(a.shape, np.float32)  # noqa: E731
    return {"input_ids": ids, "input_mask": ones(ids), "targets": tgt, "target_mask": ones(tgt)}


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

    def step(params, opt_state, batch, key):
        if microbatch is None:
            grads = jax.grad(batch_loss)(params, batch)
        else:
            grads = accumulated(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, key

    return step


def dp_step(
    family: T5Family, optimizer, batch_size: int, microbatch: int, ghost: bool, rule: str = "auto"
):
    """`dp_train`'s clipped sum over microbatches (ghost or vmap norms) plus the noisy update."""
    tapped = family.tapped_loss_fn() if ghost else None
    grad_sum = dp_train.make_clipped_grad_sum(
        family.loss_fn(), CLIP, tapped_loss_fn=tapped, norm_rule=rule
    )
    update = dp_train.make_noisy_update(
        optimizer, clip_norm=CLIP, noise_multiplier=SIGMA, expected_batch=batch_size
    )
    num_micro = batch_size // microbatch

    def step(params, opt_state, batch, key):
        shaped = jax.tree.map(lambda x: x.reshape(num_micro, microbatch, *x.shape[1:]), batch)
        mask = jnp.ones((num_micro, microbatch), jnp.float32)
        total, _, _ = grad_sum(params, {}, shaped, mask)
        key, sub = jax.random.split(key)
        params, opt_state = update(params, opt_state, total, sub)
        return params, opt_state, key

    return step


def jax_privacy_step(family: T5Family, optimizer, batch_size: int, microbatch: int):
    """`jax_privacy.clipped_grad` (clip inside its vmap, its own microbatching) + our noise."""
    from jax_privacy import clipped_grad

    loss = family.loss_fn()

    def example_loss(params, batch):
        # clipped_grad keeps a batch axis of 1 per example (keep_batch_dim=True).
        return loss(params, {}, jax.tree.map(lambda x: x[0], batch))

    grad_fn = clipped_grad(
        example_loss,
        l2_clip_norm=CLIP,
        batch_argnums=1,
        microbatch_size=microbatch if microbatch < batch_size else None,
    )
    update = dp_train.make_noisy_update(
        optimizer, clip_norm=CLIP, noise_multiplier=SIGMA, expected_batch=batch_size
    )

    def step(params, opt_state, batch, key):
        total = grad_fn(params, batch)
        key, sub = jax.random.split(key)
        params, opt_state = update(params, opt_state, total, sub)
        return params, opt_state, key

    return step


def model_flops_per_example(cfg: T5Config, input_len: int, target_len: int) -> float:
    """Analytic FLOPs of one example's non-private training step (forward + backward).

    3 x the forward's multiply-adds x 2: every projection costs 2 d_in d_out per token that
    passes through it (encoder blocks: the input tokens; decoder self-attention, feed-forward,
    cross-attention queries and outputs: the target tokens; cross-attention keys and values:
    the input tokens); attention scores and mixing cost 4 q k (heads x d_kv) per block; the LM
    head 2 d_model vocab per target token. Norms, softmax and the embedding lookup are left
    out (as in Kaplan et al. 2020's 6 N D and PaLM's appendix B count).
    """
    d, inner, n, m = cfg.d_model, cfg.num_heads * cfg.d_kv, input_len, target_len
    ff = d * cfg.d_ff * (3 if cfg.is_gated else 2)
    attn = 4 * d * inner  # q, k, v, o
    encoder = cfg.num_layers * (2 * n * (attn + ff) + 4 * n * n * inner)
    decoder = cfg.num_decoder_layers * (
        2 * m * (attn + ff)  # self-attention and feed-forward
        + 2 * (m + n) * (attn // 2)  # cross-attention: q, o on targets; k, v on inputs
        + 4 * m * m * inner
        + 4 * m * n * inner
    )
    head = 2 * m * d * cfg.vocab_size
    return 3.0 * (encoder + decoder + head)


# ---- measuring one row ------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    cfg: T5Config
    family: T5Family
    optimizer: optax.GradientTransformation
    params: Any  # arrays, or ShapeDtypeStructs with --aot-only
    batch: dict[str, Any]
    n_params: int


_SETUPS: dict[tuple, Setup] = {}


def _setup(args: argparse.Namespace) -> Setup:
    """The model, data and parameters of this run (built once per process)."""
    fields = ("preset", "dtype", "remat", "batch", "input_len", "target_len", "aot_only")
    cache_key = tuple(getattr(args, f) for f in fields)
    if cache_key not in _SETUPS:
        _SETUPS[cache_key] = _build_setup(args)
    return _SETUPS[cache_key]


def _build_setup(args: argparse.Namespace) -> Setup:
    cfg = T5Config.preset(args.preset, dtype=args.dtype, remat=args.remat)
    data = _data(cfg, args.batch, args.input_len, args.target_len)
    ids = jnp.ones((1, args.input_len), jnp.int32)

    def init():
        return T5(cfg).init(jax.random.key(0), ids, jnp.ones_like(ids), ids)["params"]

    if args.aot_only:
        params = jax.eval_shape(init)
        batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in data.items()}
    else:
        params = jax.jit(init)()
        batch = {k: jnp.asarray(v) for k, v in data.items()}
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    optimizer = dp_train.make_optimizer(LR, lora=False)
    return Setup(cfg, T5Family(cfg, tokenizer=None), optimizer, params, batch, n_params)


def hlo_census(text: str) -> dict[str, Any]:
    """Op counts of an HLO module's text (all computations, fused ones included).

    `dot_highest`: dots with operand_precision={highest,highest} (or GPU GEMM custom calls
    whose backend config says HIGHEST); `dot_f32_f32_f32` / `dot_bf16_bf16_f32`: dots that
    name that algorithm; `dot_exact`: dots with any of these (exact inputs asked for, where
    a GPU's default would round float32 to TF32); `gemm_calls`: library GEMM custom calls;
    `triton_gemm`: GEMM fusions XLA's GPU backend emits with Triton (autotuned each);
    `control_deps`: instructions with control predecessors (what optimization barriers
    become once XLA has expanded them);
    `while_trips`: known trip count -> loops; `scatters`/`gathers`/`sorts`: result and operand
    shapes of the first few; `largest`: the 5 biggest array results.
    """
    counts: dict[str, Any] = dict.fromkeys((*CENSUS_OPS, *CENSUS_EXTRA), 0)
    counts["instructions"] = 0
    targets: dict[str, int] = {}
    trips: dict[str, int] = {}
    details: dict[str, list[str]] = {"scatter": [], "gather": [], "sort": []}
    largest: list[tuple[int, str]] = []
    sizes = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2}
    # operands are printed by name only: their shapes come from their definitions
    shapes = dict(
        re.findall(r"^\s*(?:ROOT\s+)?(%[\w.-]+)\s+=\s+([a-z]+[0-9]*\[[0-9,]*\])", text, re.M)
    )
    for line in text.splitlines():
        head = re.match(r"\s*(?:ROOT\s+)?%?[\w.-]+\s+=\s+", line)
        # the opcode: the first name followed by "(" after a space (tuple shapes contain spaces)
        match = head and re.search(r"\s([a-z][a-z0-9-]*)\(", line[head.end() - 1 :])
        if not match:
            continue
        op = match[1]
        shape = line[head.end() : head.end() - 1 + match.start()].strip()
        counts["instructions"] += 1
        counts["control_deps"] += "control-predecessors=" in line
        counts["triton_gemm"] += op == "fusion" and "__triton_gemm" in line
        if op in CENSUS_OPS:
            counts[op] += 1
        if op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', line)
            if target:
                targets[target[1]] = targets.get(target[1], 0) + 1
                counts["gemm_calls"] += "gemm" in target[1] or "matmul" in target[1]
        if op in ("dot", "custom-call"):
            found = {
                "dot_highest": "operand_precision={highest,highest}" in line
                or '"operand_precision":["HIGHEST","HIGHEST"]' in line,
                **{
                    f"dot_{alg}": f"algorithm=dot_{alg}" in line or f"ALG_DOT_{alg.upper()}" in line
                    for alg in ("f32_f32_f32", "bf16_bf16_f32")
                },
            }
            for name, hit in found.items():
                counts[name] += hit
            counts["dot_exact"] += any(found.values())
        if op == "while":
            n = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            trips[n[1] if n else "?"] = trips.get(n[1] if n else "?", 0) + 1
        if op in details and len(details[op]) < 8:
            names = re.findall(r"%[\w.-]+", line[head.end() - 1 + match.end() :].split(")")[0])
            operands = ", ".join(shapes.get(name, "?") for name in names[:3])
            details[op].append(f"{re.sub(r'{[^}]*}', '', shape)} <- ({operands})")
        dims = re.fullmatch(r"([a-z]+[0-9]+)\[([0-9,]*)\](?:\{.*\})?", shape)
        if dims and dims[2]:
            size = sizes.get(dims[1], 1) * math.prod(int(x) for x in dims[2].split(","))
            largest.append((size, f"{op} {dims[1]}[{dims[2]}]"))
    largest.sort(reverse=True)
    counts["custom_call_targets"] = dict(sorted(targets.items(), key=lambda kv: -kv[1])[:5])
    counts["while_trips"] = trips
    counts.update({f"{op}s": shapes for op, shapes in details.items()})
    counts["largest"] = [f"{what} {size / 2**20:.0f} MiB" for size, what in largest[:5]]
    return counts


def _peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _compile(fn, example_args, donate, result: dict, report, hlo_dir: str | None, name: str):
    """Lowers and compiles `fn` for `example_args`, recording times and XLA's analyses."""
    start = time.perf_counter()
    lowered = jax.jit(fn, donate_argnums=donate).lower(*example_args)
    traced = time.perf_counter()
    compiled = lowered.compile()
    result["trace_s"] = traced - start
    result["compile_s"] = time.perf_counter() - traced
    text = compiled.as_text()
    result["hlo_chars"] = len(text)
    result["census"] = hlo_census(text)
    # XLA expands optimization barriers away: count them in the lowered program
    result["census"]["opt_barriers"] = lowered.as_text().count("optimization_barrier")
    if hlo_dir:
        Path(hlo_dir).mkdir(parents=True, exist_ok=True)
        (Path(hlo_dir) / f"{name}.hlo.txt").write_text(text)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    result["xla_flops"] = float((cost or {}).get("flops", float("nan")))
    memory = compiled.memory_analysis()
    for field in ("temp", "argument", "output", "alias"):
        result[f"{field}_bytes"] = getattr(memory, f"{field}_size_in_bytes", None)
    result["status"] = "compiled"
    report(result)
    return compiled


def _steps_s(call, state, steps: int) -> tuple[float, float]:
    """(seconds of the first call, mean seconds of `steps` further calls)."""
    start = time.perf_counter()
    state = call(state)
    jax.block_until_ready(state)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        state = call(state)
    jax.block_until_ready(state)
    return first, (time.perf_counter() - start) / steps


def measure(variant: str, args: argparse.Namespace, report=lambda result: None) -> dict:
    """Compiles (and unless --aot-only runs) one row; returns its figures."""
    result: dict[str, Any] = {"variant": variant, "status": "started"}
    if variant == "matmul-bf16":
        if args.aot_only:
            return {**result, "status": "skipped (aot-only)"}
        n = args.matmul_size or (8192 if jax.devices()[0].platform == "gpu" else 1024)
        a, b = (
            jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) / math.sqrt(n)
            for i in (0, 1)
        )
        compiled = _compile(jnp.dot, (a, b), (), result, report, args.hlo_dir, variant)
        first, seconds = _steps_s(lambda x: compiled(x, b), a, max(args.steps, 50))
        result.update(
            first_call_s=first,
            step_s=seconds,
            matmul_size=n,
            tflops=2 * n**3 / seconds / 1e12,
            status="ok",
        )
        return result
    if variant == "jax-privacy":
        try:
            import jax_privacy  # noqa: F401
        except ImportError:
            return {**result, "status": "not installed"}
    setup = _setup(args)
    result.update(n_params=setup.n_params, device=str(jax.devices()[0].device_kind))
    key = jax.random.key(1)
    if variant == "noise":
        shapes = [x.shape for x in jax.tree.leaves(setup.params)]

        def draw(key):
            keys = jax.random.split(key, len(shapes))
            return [jax.random.normal(k, s) for k, s in zip(keys, shapes, strict=True)]

        compiled = _compile(draw, (key,), (), result, report, args.hlo_dir, variant)
        if not args.aot_only:
            first, seconds = _steps_s(lambda _: compiled(key), None, args.steps)
            result.update(first_call_s=first, step_s=seconds, status="ok")
        return _finish(result, args)

    optimizer, family = setup.optimizer, setup.family
    if variant == "nonprivate":
        step = nonprivate_step(setup.cfg, optimizer)
    elif variant == "nonprivate-accumulated":
        step = nonprivate_step(setup.cfg, optimizer, args.microbatch)
    elif variant in ("dp-vmap", "dp-ghost"):
        ghost = variant == "dp-ghost"
        step = dp_step(family, optimizer, args.batch, args.microbatch, ghost, args.norm_rule)
    elif variant == "jax-privacy":
        step = jax_privacy_step(family, optimizer, args.batch, args.microbatch)
    else:
        raise ValueError(f"unknown variant, expected one of {VARIANTS}, {variant=}")
    if args.aot_only:
        opt_state = jax.eval_shape(optimizer.init, setup.params)
        state = (setup.params, opt_state, setup.batch, jax.eval_shape(lambda: key))
    else:
        params = jax.tree.map(jnp.copy, setup.params)  # donated below
        state = (params, optimizer.init(params), setup.batch, key)
    compiled = _compile(step, state, (0, 1), result, report, args.hlo_dir, variant)
    if not args.aot_only:
        batch = setup.batch
        first, seconds = _steps_s(
            lambda s: compiled(s[0], s[1], batch, s[2]), (state[0], state[1], state[3]), args.steps
        )
        result.update(first_call_s=first, step_s=seconds, examples_s=args.batch / seconds)
        result["status"] = "ok"
    return _finish(result, args)


def _finish(result: dict, args: argparse.Namespace) -> dict:
    if result["status"] == "compiled":
        result["status"] = "compiled (aot-only)"
    result["peak_bytes"] = _peak_bytes()
    return result


def _error_status(exc: BaseException) -> str:
    text = str(exc)
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        return "oom: " + next((ln for ln in text.splitlines() if ln.strip()), "")[:160]
    return f"error: {type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


def _child(variant: str, result_file: str, args: argparse.Namespace) -> None:
    """One row in this process; the figures go to `result_file` (after compile, then at end)."""

    def report(result):
        Path(result_file).write_text(json.dumps(result))

    try:
        report(measure(variant, args, report))
    except Exception as exc:  # noqa: BLE001 - reported as the row's status
        partial = json.loads(Path(result_file).read_text()) if Path(result_file).exists() else {}
        report({"variant": variant, **partial, "status": _error_status(exc)})


def _in_subprocess(variant: str, args: argparse.Namespace, timeout: float) -> dict:
    """Runs one row in a fresh process (its own session, killed as a group after `timeout`).

    The row's process group is also killed when this process is stopped (SIGTERM, SIGINT:
    `main` turns them into exceptions), so no row is left holding the accelerator.
    """
    with tempfile.TemporaryDirectory() as tmp:
        result_file, log = Path(tmp) / "result.json", Path(tmp) / "log.txt"
        command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
        command += ["--variant", variant, "--result-file", str(result_file)]
        start = time.perf_counter()
        with log.open("w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=out, start_new_session=True)
            status = None
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = f"timeout ({timeout:g} s)"
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        result.setdefault("variant", variant)
        result["wall_s"] = time.perf_counter() - start
        if status is not None:
            done = "compiled, run unfinished" if "compile_s" in result else "compile unfinished"
            result["status"] = f"{status}: {done}"
        elif proc.returncode != 0 or not result or result.get("status") == "started":
            tail = log.read_text().strip().splitlines()[-1:] or [""]
            result["status"] = f"crashed (rc={proc.returncode}): {tail[0][:160]}"
        return result


# ---- the report -------------------------------------------------------------------------------


def _label(variant: str, args: argparse.Namespace) -> str:
    mb = args.microbatch
    return {
        "nonprivate": "non-private (batched grad)",
        "nonprivate-accumulated": f"non-private (accumulated over {mb})",
        "noise": "Gaussian noise alone",
        "dp-vmap": f"DP vmap (microbatch {mb})",
        "dp-ghost": f"DP ghost (microbatch {mb}, {args.norm_rule}) [default]",
        "jax-privacy": f"jax_privacy.clipped_grad (microbatch {mb})",
        "matmul-bf16": "bf16 matmul (peak for MFU)",
    }[variant]


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value / scale, spec)


def _table(rows: list[dict], args: argparse.Namespace, model_flops: float, peak: float) -> str:
    base = next((r.get("examples_s") for r in rows if r["variant"] == "nonprivate"), None)
    peak_note = "fresh per row" if args.timeout_per_variant else "cumulative over rows"
    lines = [
        f"| variant | status | trace s | compile s | s/step | ex/s | vs non-private | "
        f"HLO Mchars | GFLOP/step (XLA) | temp MiB | arg+out MiB | peak MiB ({peak_note}) | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate = r.get("examples_s")
        ratio = rate / base if rate and base else None
        mfu = model_flops * rate / (peak * 1e12) if rate and peak else None
        io = (r.get("argument_bytes") or 0) + (r.get("output_bytes") or 0)
        io -= r.get("alias_bytes") or 0
        step_s = r.get("step_s")
        if r["variant"] == "matmul-bf16" and "tflops" in r:
            rate_text = f"{r['tflops']:.3g} TFLOP/s (n={r['matmul_size']})"
        else:
            rate_text = _fmt(rate, ".2f")
        cells = [
            _label(r["variant"], args),
            r["status"],
            _fmt(r.get("trace_s"), ".1f"),
            _fmt(r.get("compile_s"), ".1f"),
            _fmt(step_s, ".4g"),
            rate_text,
            _fmt(ratio, ".3f"),
            _fmt(r.get("hlo_chars"), ".2f", 1e6),
            _fmt(r.get("gflop_step"), ".4g"),
            _fmt(r.get("temp_bytes"), ".0f", 2**20),
            _fmt(io if "argument_bytes" in r else None, ".0f", 2**20),
            _fmt(r.get("peak_bytes"), ".0f", 2**20),
            _fmt(mfu, ".1%"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _census_table(rows: list[dict]) -> str:
    head = [*CENSUS_OPS, *CENSUS_EXTRA, "opt_barriers"]
    lines = [
        "| variant | " + " | ".join(head) + " | largest arrays |",
        "|---|" + "---|" * (len(head) + 1),
    ]
    for r in rows:
        census = r.get("census")
        if census and r["variant"] != "matmul-bf16":
            cells = [str(census.get(k, "–")) for k in head] + ["; ".join(census["largest"][:3])]
            lines.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _commit() -> str | None:
    """The commit of the `synthgen` measured, "+dirty" when its files differ from it."""
    here = Path(dp_train.__file__).parent

    def git(*command: str) -> str:
        run = subprocess.run(["git", *command], capture_output=True, text=True, cwd=here)
        return run.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--", ".") else "") or None
    except OSError:
        return None


def _row(variant: str, args: argparse.Namespace) -> dict:
    """One row: in a subprocess with --timeout-per-variant, else in this process."""
    if variant == "matmul-bf16" and args.aot_only:
        return {"variant": variant, "status": "skipped (aot-only)", "wall_s": 0.0}
    if args.timeout_per_variant:
        row = _in_subprocess(variant, args, args.timeout_per_variant)
    else:  # this process's backend: no JAX work happens in the parent otherwise
        start = time.perf_counter()
        try:
            row = measure(variant, args)
        except Exception as exc:  # noqa: BLE001 - reported as the row's status
            row = {"variant": variant, "status": _error_status(exc)}
        row["wall_s"] = time.perf_counter() - start
    if "xla_flops" in row:  # XLA counts a while body once: times the microbatches
        trips = args.batch // args.microbatch if variant in SCANNED else 1
        row["gflop_step"] = row["xla_flops"] * trips / 1e9
    return row


def _write_json(args: argparse.Namespace, rows: list[dict], model_flops: float, extra: dict):
    device = next((r["device"] for r in rows if "device" in r), None)
    record = {
        "args": {k: v for k, v in vars(args).items() if k not in ("variant", "result_file")},
        "commit": _commit(),
        "machine": {"device": device, "cpus": os.cpu_count(), "load": os.getloadavg()[0]},
        "model_flops_per_example": model_flops,
        "rows": rows,
        **extra,
    }
    Path(args.json).write_text(json.dumps(record, indent=1, default=str))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", help="T5 preset (t5-small dims)")
    parser.add_argument("--batch", type=int, default=16, help="physical batch of one step")
    parser.add_argument(
        "--microbatch", type=int, default=None, help="DP steps: examples per vmap (min(16, batch))"
    )
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--target-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--remat", action="store_true", help="rematerialise each T5 block")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, among {VARIANTS}"
    )
    parser.add_argument("--skip-jax-privacy", action="store_true")
    parser.add_argument(
        "--norm-rule",
        default="auto",
        choices=("auto", "ghost", "materialise"),
        help="ghost step: how weights used once by a product take their norms",
    )
    parser.add_argument("--aot-only", action="store_true", help="compile and analyse, no run")
    parser.add_argument(
        "--timeout-per-variant",
        type=float,
        default=None,
        help="run each row in its own process, killed (and reported) after this many seconds",
    )
    parser.add_argument("--matmul-size", type=int, default=None, help="8192 on GPU, else 1024")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument("--hlo-dir", default=None, help="write each row's optimised HLO here")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    args.microbatch = args.microbatch or min(16, args.batch)
    if args.batch % args.microbatch:
        parser.error("--batch must be a multiple of --microbatch")
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}, expected among {VARIANTS}")
    if args.skip_jax_privacy:
        variants = [v for v in variants if v != "jax-privacy"]
    if args.microbatch == args.batch:
        variants = [v for v in variants if v != "nonprivate-accumulated"]
    if args.variant is not None:  # one row, in a child process
        _child(args.variant, args.result_file, args)
        return

    cfg = T5Config.preset(args.preset, dtype=args.dtype, remat=args.remat)
    model_flops = model_flops_per_example(cfg, args.input_len, args.target_len)
    print(
        f"T5 {args.preset}: d_model={cfg.d_model}, layers={cfg.num_layers}+"
        f"{cfg.num_decoder_layers}, vocab={cfg.vocab_size}, dtype={args.dtype}, "
        f"remat={args.remat}, batch={args.batch}, microbatch={args.microbatch}, "
        f"input={args.input_len}, target={args.target_len}, aot_only={args.aot_only}, "
        f"model FLOPs/example={model_flops / 1e9:.2f} G (analytic, non-private step)",
        flush=True,
    )
    # A stop from outside (a part's time limit) still prints and writes what was measured,
    # and stops the row in flight (`_in_subprocess`).
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    rows: list[dict] = []
    for variant in variants:
        try:
            row = _row(variant, args)
        except (KeyboardInterrupt, SystemExit):
            rows.append({"variant": variant, "status": "stopped (signal)", "wall_s": 0.0})
            print(f"{_label(variant, args):44s} stopped by a signal: the rows after it not run")
            break
        rows.append(row)
        print(
            f"{_label(variant, args):44s} {row['status']:28s} compile "
            f"{_fmt(row.get('compile_s'), '8.1f')} s  step {_fmt(row.get('step_s'), '8.4g')} s"
            f"  wall {row['wall_s']:.1f} s",
            flush=True,
        )
        if args.json:  # after every row: a run cut short keeps its rows
            _write_json(args, rows, model_flops, {"partial": True})

    by = {r["variant"]: r for r in rows}
    rate = lambda v: by.get(v, {}).get("examples_s", float("nan"))  # noqa: E731
    peak = by.get("matmul-bf16", {}).get("tflops")
    info = next((r for r in rows if "n_params" in r), {})
    cache = jax.config.jax_compilation_cache_dir
    print(
        f"\nmachine: {info.get('device', '?')}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, commit {_commit()}, "
        f"compilation cache {'ON (compile s are cache hits): ' + cache if cache else 'off'}, "
        f"{info.get('n_params', 0) / 1e6:.1f}M parameters; GFLOP/step = XLA cost_analysis x "
        f"microbatches for scanned rows (XLA counts a while body once); MFU = "
        f"{model_flops / 1e9:.2f} GFLOP/example (analytic) x ex/s / bf16 matmul rate\n"
    )
    print(_census_table(rows) + "\n")
    print(_table(rows, args, model_flops, peak or 0.0) + "\n")
    noise_s = by.get("noise", {}).get("step_s", float("nan"))
    ghost_s = args.batch / rate("dp-ghost")
    without_noise = (args.batch / rate("nonprivate")) / (ghost_s - noise_s)
    summary = {
        "vmap_vs_nonprivate": rate("dp-vmap") / rate("nonprivate"),
        "ghost_vs_vmap": rate("dp-ghost") / rate("dp-vmap"),
        "ghost_without_noise_vs_nonprivate": without_noise,
        "ghost_vs_accumulated_nonprivate": rate("dp-ghost")
        / by.get("nonprivate-accumulated", by.get("nonprivate", {})).get(
            "examples_s", float("nan")
        ),
        "dp_vs_nonprivate": rate("dp-ghost") / rate("nonprivate"),
        "dp_vs_jax_privacy": rate("dp-ghost") / rate("jax-privacy"),
    }
    if args.json:
        _write_json(args, rows, model_flops, {"bf16_matmul_tflops": peak, **summary})
    print(" ".join(f"{k}={summary[k]:.3f}" for k in list(summary)[:4]))
    print(" ".join(f"{k}={summary[k]:.3f}" for k in ("dp_vs_nonprivate", "dp_vs_jax_privacy")))


if __name__ == "__main__":
    main()

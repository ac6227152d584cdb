"""Decoding against the machine's matmul limit: the Flax Llama's KV-cache step, in GFLOP/s.

Measured in one run, same framework (JAX on this machine's CPU) and dtype (float32):

* the sustained matmul throughput at the model's shapes: a jitted chain of
  [rows, d_model] x [d_model, d_ff] products (one per layer, `lax.fori_loop`, so dispatch
  is amortised), in GFLOP/s;
* the decode step of `synthgen.lm_backends.FlaxLM` (the DP-RAG answer loop's LM) for
  SmolLM2-135M after a 256-token prompt, at rows in {1, 8, 33, 64}: the jitted cached step
  plus the host copy of its log-probabilities, as the answer loop uses it (``step``), and
  the step alone on the device (``device``). Achieved GFLOP/s counts the model's FLOPs per
  token (2 x every matmul weight, the vocabulary projection included, plus 4 x layers x
  d_attn x context for attention) times the real rows, over the step's time;
* llama.cpp (llama-cpp-python, the server-test extra) on the same GGUF file, one row,
  2 threads: tokens per second of one-token evals after the same prompt.

Last lines: ``decode_vs_matmul=<achieved/sustained at 33 rows> tokens_per_s_33=<value>``
and ``flax_vs_llamacpp_1row=<Flax tokens/s / llama.cpp tokens/s at one row>``.

    python scripts/bench_decode.py               # a few minutes on 2 cores
    python scripts/bench_decode.py --steps 4 --rows 1 8   # smoke run
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from synthgen import assets
from synthgen.lm_backends import FlaxLM

PROMPT = 256


def model_flops_per_token(config, context: int) -> float:
    """2 x matmul weights (vocabulary projection included) + attention over `context`."""
    d, attn = config.hidden_size, config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    per_layer = d * attn + 2 * d * kv + attn * d + 3 * d * config.intermediate_size
    weights = config.num_layers * per_layer + d * config.vocab_size
    return 2.0 * weights + 4.0 * config.num_layers * attn * context


def sustained_matmul_gflops(rows: int, d_model: int, d_ff: int, layers: int, reps: int) -> float:
    """GFLOP/s of `layers` chained [rows, d_model] x [d_model, d_ff] products (jitted)."""
    key = jax.random.key(0)
    w = jax.random.normal(key, (layers, d_model, d_ff), jnp.float32) * d_model**-0.5
    back = jax.random.normal(key, (d_ff, d_model), jnp.float32) * d_ff**-0.5
    x = jax.random.normal(key, (rows, d_model), jnp.float32)

    @jax.jit
    def chain(x):
        def body(i, h):
            return jnp.tanh(h @ w[i]) @ back

        return jax.lax.fori_loop(0, layers, body, x)

    chain(x).block_until_ready()
    start = time.perf_counter()
    for _ in range(reps):
        x = chain(x)
    x.block_until_ready()
    seconds = (time.perf_counter() - start) / reps
    return 2.0 * 2 * rows * d_model * d_ff * layers / seconds / 1e9


def flax_step_seconds(lm: FlaxLM, rows: int, steps: int) -> tuple[float, float]:
    """(seconds per step with the host copy of log-probabilities, device-only seconds)."""
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(10, lm.vocab_size, PROMPT)) for _ in range(rows)]
    times = {}
    for mode in ("step", "device"):
        lm.start(prompts, steps + 2)
        tokens = jnp.zeros((lm._cache.batch,), jnp.int32)  # noqa: SLF001
        logprobs, lm._cache = lm._step(lm.params, lm._cache, tokens)  # noqa: SLF001 - warm-up
        np.asarray(logprobs)
        start = time.perf_counter()
        for _ in range(steps):
            logprobs, lm._cache = lm._step(lm.params, lm._cache, tokens)  # noqa: SLF001
            if mode == "step":
                np.asarray(logprobs[:rows])
        logprobs.block_until_ready()
        times[mode] = (time.perf_counter() - start) / steps
    return times["step"], times["device"]


def llamacpp_tokens_per_s(gguf: str, steps: int) -> float | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(gguf, n_ctx=PROMPT + steps + 8, n_threads=2, verbose=False)
    rng = np.random.default_rng(0)
    llm.eval([int(t) for t in rng.integers(10, 40000, PROMPT)])
    start = time.perf_counter()
    for _ in range(steps):
        llm.eval([11])
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 33, 64])
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    lm = FlaxLM.load(args.model)
    config = lm.config
    flops = model_flops_per_token(config, PROMPT + args.steps // 2)
    print(f"SmolLM2 step: {flops / 1e6:.0f} MFLOP per token at context {PROMPT}")
    print("| rows | padded rows | matmul GFLOP/s | step s | step GFLOP/s | device s | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for rows in args.rows:
        sustained = sustained_matmul_gflops(
            rows, config.hidden_size, config.intermediate_size, config.num_layers, reps=20
        )
        step_s, device_s = flax_step_seconds(lm, rows, args.steps)
        achieved = flops * rows / step_s / 1e9
        padded = lm._cache.batch  # noqa: SLF001
        results[rows] = (sustained, achieved, rows / step_s)
        print(
            f"| {rows} | {padded} | {sustained:.1f} | {step_s:.4f} | {achieved:.1f} "
            f"| {device_s:.4f} | {rows / step_s:.1f} |"
        )
    ref = 33 if 33 in results else args.rows[-1]
    sustained, achieved, tokens_per_s = results[ref]
    print(f"decode_vs_matmul={achieved / sustained:.3f} tokens_per_s_33={tokens_per_s:.1f}")
    gguf = Path(assets.resolve(args.model)) if args.model in assets.REGISTRY else Path(args.model)
    if gguf.is_dir():
        gguf = sorted(gguf.rglob("*.gguf"))[0]
    cpp = llamacpp_tokens_per_s(str(gguf), args.steps)
    if cpp is None or 1 not in results:
        print("flax_vs_llamacpp_1row=nan (llama-cpp-python not installed or no 1-row run)")
    else:
        print(f"llama.cpp 1 row: {cpp:.1f} tokens/s; Flax: {results[1][2]:.1f} tokens/s")
        print(f"flax_vs_llamacpp_1row={results[1][2] / cpp:.3f}")


if __name__ == "__main__":
    main()

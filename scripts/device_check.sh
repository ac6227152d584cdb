#!/usr/bin/env bash
# The device check of the main job (docs/guides/gpu.md): one call on a fresh GPU machine, at
# most 9 minutes, every figure into $OUT. What it runs, each under its own time limit, so a
# part that hangs or fails leaves the others' figures:
#   0. the rounding of exact-input matmuls (bf16 and f32 inputs, f32 accumulation) against
#      the clip bound's model, u = 2^-23 per addition (synthgen/clip_rounding.py; 40 s);
#   1. the accelerator-marked tests and the DP core tests at the device's precision (2.5 min);
#   2. the DP step bench: t5-small at batch 64 and 256 (128/32 tokens), t5-base at 384/128
#      in bfloat16 with remat: compile s, examples/s of every path, peak memory, MFU (~3.5 min);
#   3. the main job's other device work against transformers (~2 min).
# On this machine, first: make device-wheels (pure-Python wheels the GPU image lacks), then
# with the device tool: run(command="bash scripts/device_check.sh", carry=[".wheels"],
# timeout_s=570).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda} PYTHONPATH=. HF_DATASETS_OFFLINE=1
PY=${PY:-python}
if compgen -G ".wheels/*.whl" >/dev/null; then
  $PY -m pip install -q --no-deps .wheels/*.whl 2>&1 | tail -2
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
  git rev-parse --short HEAD 2>/dev/null || echo "commit: unknown"
} 2>&1 | tee "$OUT/device.txt"

part() {  # part NAME SECONDS COMMAND...: runs one part, its output in $OUT/NAME.txt
  local name=$1 seconds=$2; shift 2
  echo "== $name (limit ${seconds}s)"
  timeout "$seconds" "$@" >"$OUT/$name.txt" 2>&1
  echo "exit $? after ${SECONDS}s in all"; tail -n 25 "$OUT/$name.txt"
}

# TINY=1: the same parts at tiny sizes, on any machine (how the script is smoke-tested here).
if [ "${TINY:-0}" = 1 ]; then
  small="--preset tiny --batch 8 --microbatch 4"; small_256=$small
  base="--preset tiny --batch 8 --microbatch 4 --dtype bfloat16 --remat"
  tests="-k float64 tests/synthgen/test_ghost_clipping.py"; main_job=--tiny
else
  small="--preset small --batch 64 --microbatch 16"
  small_256="--preset small --batch 256 --microbatch 32"
  base="--preset base --input-len 384 --target-len 128 --batch 64 --microbatch 16"
  base="$base --dtype bfloat16 --remat"
  tests="tests/synthgen/test_ghost_clipping.py tests/synthgen/test_dp_train.py"; main_job=
fi
fast=nonprivate,noise,dp-ghost,matmul-bf16

# The clip bound assumes, not measures, that a k-term product with float32 accumulation is
# off by at most gamma_k = k u / (1 - k u) times the sum of its terms' magnitudes, u = 2^-23
# (tensor cores truncate: Fasi et al. 2021). This measures it on the device's own kernels.
part matmul_rounding 40 $PY - <<'PY'
"""[64, k] @ [k, 64] with exact inputs and float32 accumulation, against float64.

err: the largest |computed - exact| / sum_t |x_t y_t| over the entries (the inputs are the
algorithm's input type, so float64 products are exact). ratio = err / gamma_k must stay
<= 1 for the model to hold. u_seen = err / k in units of float32's unit roundoff 2^-24: a
sequential sum of positive terms that truncates reaches about 0.5 (half an ulp lost per
addition on average), one that rounds to nearest far less (its errors cancel), a blocked or
tree sum less again; the model allows 2.
"""

import jax
import jax.numpy as jnp
import numpy as np

from synthgen.clip_rounding import BOUND_UNIT, gamma

device = jax.devices()[0]
print(f"{device.platform} {device.device_kind}; the model's u = 2^{np.log2(BOUND_UNIT):.0f}")
print(f"{'algorithm':14s} {'inputs':9s} {'k':>6s} {'err':>9s} {'gamma_k':>9s} {'ratio':>6s} u_seen")
rng = np.random.default_rng(0)
worst = 0.0
for algorithm, dtype in (("BF16_BF16_F32", jnp.bfloat16), ("F32_F32_F32", jnp.float32)):
    for k in (16, 256, 4096, 65536):
        for inputs in ("positive", "signed", "one-large"):
            if inputs == "signed":
                x, y = rng.normal(size=(64, k)), rng.normal(size=(k, 64))
            else:
                x, y = rng.uniform(0, 1, size=(64, k)), rng.uniform(0, 1, size=(k, 64))
                if inputs == "one-large":  # one term 2^12 times the others: alignment
                    x[:, 0] = 2.0**12
            xd, yd = jnp.asarray(x, dtype), jnp.asarray(y, dtype)
            got = jnp.einsum(
                "mk,kn->mn", xd, yd, precision=algorithm, preferred_element_type=jnp.float32
            )
            x64 = np.asarray(xd.astype(jnp.float32), np.float64)
            y64 = np.asarray(yd.astype(jnp.float32), np.float64)
            exact, size = x64 @ y64, np.abs(x64) @ np.abs(y64)
            err = float(np.max(np.abs(np.asarray(got, np.float64) - exact) / size))
            worst = max(worst, err / gamma(k))
            print(
                f"{algorithm:14s} {inputs:9s} {k:6d} {err:9.2e} {gamma(k):9.2e} "
                f"{err / gamma(k):6.3f} {err / k / 2.0**-24:.2f}"
            )
verdict = "within" if worst <= 1 else "EXCEEDS"
print(f"matmul_rounding_worst_ratio={worst:.3f} ({verdict} the model's gamma_k)")
PY
part tests 150 $PY -m pytest -q -p no:cacheprovider --durations=10 $tests
part dp_small 100 $PY scripts/bench_dp_step.py $small --steps 5 --timeout-per-variant 45 \
  --json "$OUT/dp_small.json"
part dp_small_256 60 $PY scripts/bench_dp_step.py $small_256 --steps 5 \
  --timeout-per-variant 25 --variants $fast --json "$OUT/dp_small_256.json"
part dp_base 90 $PY scripts/bench_dp_step.py $base --steps 3 --timeout-per-variant 40 \
  --variants $fast --json "$OUT/dp_base.json"
part main_job 90 $PY scripts/bench_main_job_device.py $main_job --out "$OUT/main_job.json"
echo "== done in ${SECONDS}s; files in $OUT"

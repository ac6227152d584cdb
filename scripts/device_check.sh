#!/usr/bin/env bash
# The device check of the main job (docs/guides/gpu.md): one call on a fresh GPU machine, at
# most 8 minutes, every figure into $OUT. What it runs, each under its own time limit, so a
# part that hangs or fails leaves the others' figures:
#   1. the accelerator-marked tests and the DP core tests at the device's precision (2.5 min);
#   2. the DP step bench: t5-small at batch 64 and 256 (128/32 tokens), t5-base at 384/128
#      in bfloat16 with remat: compile s, examples/s of every path, peak memory, MFU (~3.5 min);
#   3. the main job's other device work against transformers (~2 min).
# On this machine, first: make device-wheels (pure-Python wheels the GPU image lacks), then
# with the device tool: run(command="bash scripts/device_check.sh", carry=[".wheels"],
# timeout_s=540).
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

part tests 150 $PY -m pytest -q -p no:cacheprovider --durations=10 $tests
part dp_small 100 $PY scripts/bench_dp_step.py $small --steps 5 --timeout-per-variant 45 \
  --json "$OUT/dp_small.json"
part dp_small_256 60 $PY scripts/bench_dp_step.py $small_256 --steps 5 \
  --timeout-per-variant 25 --variants $fast --json "$OUT/dp_small_256.json"
part dp_base 90 $PY scripts/bench_dp_step.py $base --steps 3 --timeout-per-variant 40 \
  --variants $fast --json "$OUT/dp_base.json"
part main_job 90 $PY scripts/bench_main_job_device.py $main_job --out "$OUT/main_job.json"
echo "== done in ${SECONDS}s; files in $OUT"

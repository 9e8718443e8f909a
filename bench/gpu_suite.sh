#!/usr/bin/env bash
# The bundled suite on the GPU, for bench/README.md. Run on the GPU host from the repository root
# (after scripts/fetch-gpu-deps.sh here, carrying .deps):  bench/gpu_suite.sh PART OUTDIR
#   PART = rtc:     build, kz_rtc GPU tests, cuda-rtc examples, the reference as its own candidate
#   PART = others:  build, triton examples, cuda (load_inline) examples
#   PART = checks:  build, the gpu-labelled CTest tests (sandbox CUDA fault, ...) and the GPU-only
#                   cheat fixtures (expected: torch_compute_in_forward, no_custom_kernel,
#                   wrong_during_timing)
#   PART = model:   build, bench/model_bench.py: the libtorch engine (kz_model_bench) against
#                   transformers on a random-init Qwen2.5-7B-shaped checkpoint (~4 min after the build)
# Every evaluation is a real `kz eval-suite` run with timings; results.jsonl and tables in OUTDIR.
set -uo pipefail
PART=${1:?rtc, others, checks or model}
FINAL=${2:?output directory}
OUT=$(mktemp -d)   # everything lands here; FINAL gets one archive (the device tool returns few files)
mkdir -p "$FINAL"
export KZ_SKIP_APT=1 KZ_PYTHON="$(command -v python3)" KZ_DEPS_PREFIX="$PWD/.deps"
scripts/setup.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

suite() {  # suite NAME CANDIDATE_DIR [extra kz flags...]
  local name=$1 dir=$2; shift 2
  echo "== $name =="
  local start=$SECONDS
  build/kz eval-suite --suite suite/kzbench --candidates "$dir" \
    --device cuda:0 --no-cache --out "$OUT/$name.jsonl" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  cat "$OUT/$name.txt"; tail -2 "$OUT/$name.err"; echo "$name: $((SECONDS - start)) s wall"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
}

if [[ $PART == rtc ]]; then
  (cd worker && python3 -m pytest -q -p no:cacheprovider tests/test_kz_rtc.py 2>&1 | tail -5)
  suite cuda-rtc suite/examples/cuda-rtc
  mkdir -p /tmp/kz_refs && cp suite/kzbench/level*/*.py /tmp/kz_refs/
  suite reference-as-candidate /tmp/kz_refs --format torch
elif [[ $PART == checks ]]; then
  (cd build && ctest -L gpu --output-on-failure 2>&1 | tail -40) | tee "$OUT/ctest-gpu.txt"
  for f in eval/tests/cheats/cuda_aten_in_extension.py eval/tests/cheats/cuda_rtc_torch_compute.py \
           eval/tests/cheats/cache_by_pointer_late.py; do
    build/kz eval suite/kzbench/level1/02_relu.py "$f" --device cuda:0 --no-cache --json | tee -a "$OUT/cheats-gpu.jsonl"
  done
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
elif [[ $PART == model ]]; then
  # Its checkpoint (15 GB) goes to the system temp dir, not into the archive; the table comes last.
  start=$SECONDS
  python3 bench/model_bench.py --kz-bin build/model/kz_model_bench --out "$OUT/model" \
    > "$OUT/model.txt" 2> "$OUT/model.err"
  echo "model_bench exit $?, $((SECONDS - start)) s wall"; tail -4 "$OUT/model.err"
  tar -C "$OUT" -czf "$FINAL/results-$PART.tgz" .
  cat "$OUT/model.txt"
else
  suite triton suite/examples/triton
  suite cuda suite/examples/cuda
fi

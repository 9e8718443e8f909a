#!/usr/bin/env bash
# The benchmark batch through the real kz under the CPU backend (bench/kernelbench_compare.py
# --device cpu, KernelBench skipped): triton candidates run under the Triton interpreter, cuda-rtc
# ones are compiled by NVRTC. Every verdict must be the one the manifest expects on a CPU machine.
# The cuda part builds with nvcc, minutes per candidate on a small machine: run it by hand with
# --formats cuda. Then part of it through `kz serve-eval` (bench/service_batch.py), two rounds.
# usage: batch_cpu_test.sh KZ_BINARY
set -euo pipefail
KZ=${1:?kz binary}
SRC=${KZ_SOURCE_DIR:?}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
python3 "$SRC/bench/kernelbench_compare.py" --kz "$KZ" --device cpu --skip kb --formats cuda-rtc,triton \
  --no-settle --out "$OUT/run" | tee "$OUT/log"
grep -Eq "^verdicts: kz ([0-9]+)/\1 as expected" "$OUT/log" || { echo "FAILED: a verdict differs"; exit 1; }
grep -q "timing stability of 07_softmax (cuda-rtc): not measured (needs a GPU)" "$OUT/log"
grep -q "timeline (s from the batch's start" "$OUT/log" || { echo "FAILED: kz's verdicts carry no started_s"; exit 1; }
# The same batch through `kz serve-eval` (bench/service_batch.py), two rounds in other bytes.
python3 "$SRC/bench/service_batch.py" --kz "$KZ" --device cpu --formats cuda-rtc,triton --limit 8 \
  --out "$OUT/service" | tee "$OUT/service-log"
for round in 1 2; do
  grep -Eq "^round $round: .* verdicts ([0-9]+)/\1 as expected(;|$)" "$OUT/service-log" \
    || { echo "FAILED: a verdict of the service's round $round differs"; exit 1; }
done
echo "ok: every verdict as expected"

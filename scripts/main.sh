#!/usr/bin/env bash
# The main job on its embedded default (CPU, no GPU, no network): set up, then evaluate the
# bundled suite with its bundled example candidates and print the summary tables. Triton
# candidates run under the Triton interpreter; cuda-rtc candidates are compiled with NVRTC and
# reported compiled_not_run (no GPU to run them on). Results land in runs/main/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
for format in triton cuda-rtc; do
  echo "== kzbench, $format candidates, CPU =="
  build/kz eval-suite --suite suite/kzbench --candidates "suite/examples/$format" --device cpu \
    --out "runs/main/$format.results.jsonl"
done

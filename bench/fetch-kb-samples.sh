#!/usr/bin/env bash
# Fetches the public KernelBench generations that bench/kernelbench_agreement.py evaluates with both
# harnesses, and extracts them into .kb-samples/ (ignored by git: the kernels are data written by
# others, read at run time, never committed here). Run it where there is network, after
# bench/fetch-kernelbench.sh (the problems are matched against that checkout), and carry
# .kb-samples/ (~3 MB) to the GPU host.
#
# The source: technoabsurdist/KernelBench, a fork of KernelBench whose runs/ folder holds the
# output of KernelBench's own scripts (generate_samples.py, then eval_from_generations.py): one
# sample per problem, `ModelNew` modules with CUDA through load_inline, and eval_results.json,
# KernelBench's verdicts for them on an A100. Five runs of levels 1 and 2 (gemini-2.5-pro,
# Qwen3, Qwen2.5-Coder), correct and incorrect alike.
#
# Usage: bench/fetch-kb-samples.sh [COMMIT]   (KB_SAMPLES_URL overrides the repository URL, e.g. a
# local mirror; KERNELBENCH the checkout, default .kb/KernelBench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT=${1:-9202a5c5786ab959fcaa3b4ce0356348bb87c86a}
URL=${KB_SAMPLES_URL:-https://github.com/technoabsurdist/KernelBench.git}
KERNELBENCH=${KERNELBENCH:-$ROOT/.kb/KernelBench}
[[ -d "$KERNELBENCH/KernelBench/level1" ]] || {
  echo "no KernelBench checkout at $KERNELBENCH: run bench/fetch-kernelbench.sh first" >&2; exit 1; }
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
git -C "$SRC" init -q
git -C "$SRC" remote add origin "$URL"
git -C "$SRC" fetch -q --depth 1 origin "$COMMIT"
git -C "$SRC" checkout -q --detach FETCH_HEAD
python3 "$ROOT/bench/kb_samples.py" --source "$SRC" --repo technoabsurdist/KernelBench \
  --commit "$(git -C "$SRC" rev-parse HEAD)" --kernelbench "$KERNELBENCH" --out "$ROOT/.kb-samples"

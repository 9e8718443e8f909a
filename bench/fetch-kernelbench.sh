#!/usr/bin/env bash
# Fetches KernelBench (ScalingIntelligence/KernelBench) for bench/kernelbench_compare.py into
# .kb/KernelBench, which git ignores: its code is read and run by the benchmark, never committed
# here. Run it on a machine with network; for a GPU host without one, carry .kb/ along (a shallow
# clone, ~5 MB). Usage: bench/fetch-kernelbench.sh [COMMIT]   (default: the commit the
# benchmark was written against; any later one should work while its eval API stays the same;
# KB_URL overrides the repository URL, e.g. a local mirror).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT=${1:-423217d9fda91e0c2d67e4a43bf62f96f6d104f1}
DEST="$ROOT/.kb/KernelBench"
if [[ ! -d "$DEST/.git" ]]; then
  mkdir -p "$DEST"
  git -C "$DEST" init -q
  git -C "$DEST" remote add origin "${KB_URL:-https://github.com/ScalingIntelligence/KernelBench.git}"
fi
git -C "$DEST" fetch -q --depth 1 origin "$COMMIT"
git -C "$DEST" checkout -q --detach FETCH_HEAD
echo "KernelBench $(git -C "$DEST" rev-parse --short HEAD) in .kb/KernelBench"
echo "  python3 bench/kernelbench_compare.py --kernelbench .kb/KernelBench --out runs/kb-compare"

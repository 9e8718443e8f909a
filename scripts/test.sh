#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every CPU test: C++ unit and integration tests,
# the worker's pytest suite, and the CLI tests, all through CTest. GPU tests (label gpu) need a
# GPU: run `ctest --test-dir build -L gpu` on such a machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
log=$(mktemp)
status=0
ctest --test-dir build -L cpu --output-on-failure -j "$(nproc)" --timeout 1800 2>&1 | tee "$log" || status=$?
if ((status != 0)); then
  # A long failing test's own lines can fall in the middle of a log that is read from its two ends:
  # repeat them, then ctest's closing lines again, last.
  echo "== the failures' own lines, again (the whole of every test's output: build/Testing/Temporary/LastTest.log) =="
  grep -E -A6 '^\[  FAILED  \] |: Failure$|^E   |^FAILED |^ERROR ' build/Testing/Temporary/LastTest.log | head -200 || true
  sed -n '/% tests passed/,$p' "$log"
fi
rm -f "$log"
exit "$status"

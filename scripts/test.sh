#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every CPU test: C++ unit and integration tests,
# the worker's pytest suite, and the CLI tests, all through CTest. GPU tests (label gpu) need a
# GPU: run `ctest --test-dir build -L gpu` on such a machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
cd "$ROOT"
ctest --test-dir build -L cpu --output-on-failure -j "$(nproc)" --timeout 1800

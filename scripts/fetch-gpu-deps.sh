#!/usr/bin/env bash
# For machines without a package registry (the GPU host): downloads the Debian -dev packages
# that may be missing there (header-only ones, and SQLite for the verdict cache) and unpacks them
# into .deps/. cpp-httplib is left out: without it `kz serve-eval` is simply not built. Then, there:
#   KZ_SKIP_APT=1 KZ_PYTHON=$(command -v python3) KZ_DEPS_PREFIX=$PWD/.deps scripts/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$ROOT/.deps/debs"
cd "$ROOT/.deps/debs"
apt-get download libtomlplusplus-dev libxxhash-dev libcli11-dev nlohmann-json3-dev libsqlite3-dev libsqlite3-0 >/dev/null
for deb in *.deb; do dpkg -x "$deb" "$ROOT/.deps"; done
echo "unpacked into $ROOT/.deps: $(ls "$ROOT/.deps/debs" | tr '\n' ' ')"

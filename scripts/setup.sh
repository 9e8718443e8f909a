#!/usr/bin/env bash
# Idempotent set-up of everything KernelZero needs on a Debian machine:
#   1. the Debian -dev packages of the C++ dependencies (apt, as root),
#   2. the worker's Python venv with pinned torch/triton/numpy (requirements.txt),
#   3. the CMake build, which leaves the CLI at build/kz,
#   4. bytecode for the worker interpreter if its packages carry none (build/pycache),
#   5. what the workers' lighter load_inline builds read: the full torch header's names and main.cpp's
#      prelude precompiled (build/lighter-builds).
# Re-running it only redoes what changed. Environment knobs:
#   KZ_VENV        venv location (default ~/.cache/kernelzero/venv-<hash of requirements.txt>)
#   KZ_BUILD_TYPE  CMake build type (default Release)
#   KZ_SKIP_APT=1  skip the apt step (machines without a registry, e.g. the GPU host)
#   KZ_PYTHON      use this interpreter (with torch/triton already installed) instead of the venv
#   KZ_DEPS_PREFIX Debian packages unpacked by scripts/fetch-gpu-deps.sh (read by CMakeLists.txt)
#   KZ_BUILD_TARGETS  build only these targets (e.g. "kz" for a benchmark run); default: all
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

APT_PACKAGES=(cmake g++ pkg-config nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libfmt-dev
              libgtest-dev libgmock-dev libxxhash-dev libcurl4-openssl-dev
              libsqlite3-dev libcpp-httplib-dev libgloo-dev)

install_apt_packages() {
  [[ "${KZ_SKIP_APT:-0}" == 1 ]] && return
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "[setup] apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

venv_dir() {
  local hash
  hash=$(sha256sum requirements.txt | cut -c1-12)
  echo "${KZ_VENV:-$HOME/.cache/kernelzero/venv-$hash}"
}

install_venv() {
  [[ -n "${KZ_PYTHON:-}" ]] && return
  local venv; venv="$(venv_dir)"
  if [[ ! -f "$venv/.kz-complete" ]]; then
    echo "[setup] creating Python venv at $venv (torch, triton, numpy; a few minutes the first time)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -r requirements.txt
    touch "$venv/.kz-complete"
  fi
  ln -sfn "$venv" "$ROOT/.venv"
}

build() {
  local jobs; jobs=$(nproc)
  cmake -S . -B build -DCMAKE_BUILD_TYPE="${KZ_BUILD_TYPE:-Release}" -DKZ_PYTHON="${KZ_PYTHON:-$ROOT/.venv/bin/python}" >/dev/null
  local targets=()
  for target in ${KZ_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
  cmake --build build -j "$jobs" "${targets[@]}"
}

# Bytecode for the worker interpreter where its installation carries none (the GPU host's torch):
# build/pycache, which kz hands its workers (scripts/compile_worker_bytecode.py).
compile_worker_bytecode() {
  "${KZ_PYTHON:-$ROOT/.venv/bin/python}" scripts/compile_worker_bytecode.py build/pycache
}

# What the workers' lighter load_inline builds read (the full torch header's names, main.cpp's prelude
# precompiled): build/lighter-builds, which kz hands its workers (scripts/prepare_lighter_builds.py).
prepare_lighter_builds() {
  "${KZ_PYTHON:-$ROOT/.venv/bin/python}" scripts/prepare_lighter_builds.py build/lighter-builds
}

# Triton's driver helper, built once for every Triton evaluation's own cache: build/triton-helpers,
# which kz hands its workers (scripts/prepare_triton_helpers.py; needs the GPU driver's libcuda).
prepare_triton_helpers() {
  "${KZ_PYTHON:-$ROOT/.venv/bin/python}" scripts/prepare_triton_helpers.py build/triton-helpers
}

install_apt_packages
install_venv
build
compile_worker_bytecode
prepare_lighter_builds
prepare_triton_helpers
echo "[setup] done: build/kz"

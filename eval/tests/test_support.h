// Shared by the evaluation engine's tests: where the sources are, and whether nvcc is here.
#pragma once

#include <cstdlib>
#include <filesystem>

namespace kz::test {

// The repository root (KZ_SOURCE_DIR, which CTest sets): the suite, the fixtures, the worker.
// Empty when unset; tests that need it fail with a hint.
inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return dir && *dir ? std::filesystem::path(dir) : std::filesystem::path();
}

// Whether load_inline can find nvcc (CUDA_HOME, /usr/local/cuda or PATH): the `cuda` builds' tests skip
// without it.
inline bool have_nvcc() {
  const char* cuda_home = std::getenv("CUDA_HOME");
  if (cuda_home && std::filesystem::exists(std::filesystem::path(cuda_home) / "bin" / "nvcc")) return true;
  return std::filesystem::exists("/usr/local/cuda/bin/nvcc") || std::system("command -v nvcc > /dev/null 2>&1") == 0;
}

}  // namespace kz::test

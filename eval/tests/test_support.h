// Shared by the evaluation engine's tests: where the sources are, and whether nvcc is here.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace kz::test {

// The repository root (KZ_SOURCE_DIR, which CTest sets): the suite, the fixtures, the worker.
// Empty when unset; tests that need it fail with a hint.
inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return dir && *dir ? std::filesystem::path(dir) : std::filesystem::path();
}

// nvcc as load_inline finds it: $CUDA_HOME/bin/nvcc, /usr/local/cuda/bin/nvcc, else "nvcc" (PATH).
inline std::string nvcc_path() {
  const char* cuda_home = std::getenv("CUDA_HOME");
  if (cuda_home && std::filesystem::exists(std::filesystem::path(cuda_home) / "bin" / "nvcc"))
    return (std::filesystem::path(cuda_home) / "bin" / "nvcc").string();
  return std::filesystem::exists("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : "nvcc";
}

// Whether load_inline can find nvcc (nvcc_path): the `cuda` builds' tests skip without it.
inline bool have_nvcc() {
  return nvcc_path() != "nvcc" || std::system("command -v nvcc > /dev/null 2>&1") == 0;
}

}  // namespace kz::test

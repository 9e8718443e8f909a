// kz-nvcc: what load_inline runs as nvcc in kz's workers (PYTORCH_NVCC), with the host and device
// halves of a compile at once (kz/eval/parallel_nvcc.h). The real nvcc: $KZ_REAL_NVCC, else
// $CUDA_HOME/bin/nvcc, else nvcc on PATH.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kz/eval/parallel_nvcc.h"

int main(int argc, char** argv) {
  std::string real_nvcc = "nvcc";
  if (const char* chosen = std::getenv("KZ_REAL_NVCC"); chosen && *chosen) {
    real_nvcc = chosen;
  } else if (const char* home = std::getenv("CUDA_HOME"); home && *home) {
    std::filesystem::path in_home = std::filesystem::path(home) / "bin" / "nvcc";
    if (std::filesystem::exists(in_home)) real_nvcc = in_home.string();
  }
  return kz::nvcc::run(real_nvcc, std::vector<std::string>(argv + 1, argv + argc));
}

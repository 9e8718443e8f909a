// The candidate writers of each format (triton.cpp, cuda_rtc.cpp) and the module frame they share
// (candidates.cpp).
#pragma once

#include <string>
#include <vector>

#include "kz/teacher/render.h"

namespace kz::teacher {

// What a format's writer contributes to a candidate file.
struct CandidateCode {
  std::string kernels;               // module-level code after the imports: kernels, SOURCE
  std::vector<std::string> init;     // ModelNew.__init__ lines after the reference's own submodules
  std::vector<std::string> forward;  // ModelNew.forward's body
};

std::string render_triton(const ModuleSpec& spec, Fusion fusion, int block_size);
std::string render_cuda_rtc(const ModuleSpec& spec, Fusion fusion, int block_size);

// The candidate file: its docstring, `imports`, `code.kernels`, then ModelNew with the reference's
// __init__ arguments and submodules (same names, so the harness copies their weights) and the
// forward over the reference's inputs.
std::string candidate_module(const ModuleSpec& spec, const CandidateSpec& candidate, const std::string& imports,
                             const CandidateCode& code);

}  // namespace kz::teacher

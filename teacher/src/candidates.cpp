// Candidates of a teacher module: formats, fusions, block sizes, and the ModelNew frame every
// format's writer fills (render_candidate in kz/teacher/render.h; the writers in triton.cpp and
// cuda_rtc.cpp).
#include <fmt/format.h>

#include "kz/teacher/render.h"
#include "ops_text.h"
#include "writers.h"

namespace kz::teacher {
namespace {

std::string describe(const CandidateSpec& candidate, const ModuleSpec& spec) {
  const char* block = spec.kind == Kind::gemm ? "TILE" : candidate.format == Format::triton ? "BLOCK" : "THREADS";
  const char* kernels = candidate.fusion == Fusion::fused ? "one kernel" : "one kernel per op";
  return fmt::format("Teacher candidate ({}, {}, {} {}): {}, {}.", format_name(candidate.format),
                     fusion_name(candidate.fusion), block, candidate.block_size, expression(spec), kernels);
}

}  // namespace

const char* format_name(Format format) { return format == Format::triton ? "triton" : "cuda-rtc"; }

Result<Format> parse_format(const std::string& name) {
  if (name == "triton") return Format::triton;
  if (name == "cuda-rtc") return Format::cuda_rtc;
  return invalid_argument(fmt::format("format must be triton or cuda-rtc, got '{}'", name));
}

const char* fusion_name(Fusion fusion) { return fusion == Fusion::fused ? "fused" : "unfused"; }

std::vector<int> block_sizes(const ModuleSpec& spec, Format format) {
  if (spec.kind == Kind::gemm) return format == Format::triton ? std::vector<int>{32, 16, 64} : std::vector<int>{16, 8, 32};
  if (spec.kind == Kind::reduction && format == Format::triton) return {128, 64, 256};
  return {256, 128, 512};
}

std::string render_candidate(const ModuleSpec& spec, const CandidateSpec& candidate) {
  return candidate.format == Format::triton ? render_triton(spec, candidate.fusion, candidate.block_size)
                                            : render_cuda_rtc(spec, candidate.fusion, candidate.block_size);
}

std::string candidate_module(const ModuleSpec& spec, const CandidateSpec& candidate, const std::string& imports,
                             const CandidateCode& code) {
  std::vector<std::string> parameters = {"x"};
  for (const std::string& name : operand_inputs(spec)) parameters.push_back(name);
  std::vector<std::string> init = {"super().__init__()"};
  for (const std::string& line : text::weight_submodule(spec)) init.push_back(line);
  for (const std::string& line : code.init) init.push_back(line);

  std::string out = fmt::format("\"\"\"{}\"\"\"\n{}{}\n\nclass ModelNew(nn.Module):\n", describe(candidate, spec),
                                imports, code.kernels);
  std::string arguments = text::init_arguments(spec);
  out += fmt::format("    def __init__(self{}):\n{}", arguments.empty() ? "" : ", " + arguments, text::indented(init, 8));
  out += fmt::format("\n    def forward(self, {}):\n{}", text::joined(parameters), text::indented(code.forward, 8));
  return out;
}

}  // namespace kz::teacher

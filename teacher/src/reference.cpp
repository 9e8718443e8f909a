// The KernelBench-format reference of a teacher module (render_reference in kz/teacher/render.h).
//
// Plain torch ops, one statement per op on the running value `h`, so the code reads as the
// grammar expression does. Sizes are module-level constants that get_inputs() reads at call time,
// which lets the evaluator's `cpu_sizes` and `--size` override them.
#include <fmt/format.h>

#include <algorithm>

#include "kz/teacher/render.h"
#include "ops_text.h"

namespace kz::teacher {
namespace {

// The size constants' names: x is (<rows>, <cols>); a gemm's x is (batch_size, in_features).
struct SizeNames {
  const char* rows;
  const char* cols;
};

SizeNames size_names(const ModuleSpec& spec) {
  return spec.kind == Kind::gemm ? SizeNames{"batch_size", "out_features"} : SizeNames{"rows", "cols"};
}

bool uses_functional(const ModuleSpec& spec) {
  return std::any_of(spec.chain.begin(), spec.chain.end(),
                     [](const Step& s) { return s.op == Op::silu || s.op == Op::gelu_tanh; });
}

std::string operand_shape(Operand operand, const SizeNames& n) {
  switch (operand) {
    case Operand::full: return fmt::format("({}, {})", n.rows, n.cols);
    case Operand::row: return fmt::format("({},)", n.cols);
    case Operand::col: return fmt::format("({}, 1)", n.rows);
    default: return "";
  }
}

std::string randn_of(Operand operand, const SizeNames& n) {
  switch (operand) {
    case Operand::full: return fmt::format("torch.randn({}, {})", n.rows, n.cols);
    case Operand::row: return fmt::format("torch.randn({})", n.cols);
    case Operand::col: return fmt::format("torch.randn({}, 1)", n.rows);
    default: return "";
  }
}

// "relu(add(x, row)): x (rows, cols); row (cols,)."
std::string docstring(const ModuleSpec& spec, const SizeNames& n) {
  std::string inputs = spec.kind == Kind::gemm ? "x (batch_size, in_features)" : fmt::format("x ({}, {})", n.rows, n.cols);
  for (const Step& step : spec.chain)
    if (text::is_tensor_operand(step.operand))
      inputs += fmt::format("; {} {}", step.value, operand_shape(step.operand, n));
  std::string what = spec.kind == Kind::gemm ? "linear = nn.Linear(in_features, out_features); " : "";
  return fmt::format("\"\"\"{}{}: {}.\"\"\"", what, expression(spec), inputs);
}

std::vector<std::string> init_lines(const ModuleSpec& spec) {
  std::vector<std::string> lines = text::weight_submodule(spec);
  // Weights away from their defaults (ones, zeros), so a candidate that ignores them is wrong.
  if (spec.reducer == Reducer::layer_norm)
    for (const char* line : {"with torch.no_grad():", "    self.norm.weight.normal_(1.0, 0.1)", "    self.norm.bias.normal_(0.0, 0.1)"})
      lines.push_back(line);
  if (spec.reducer == Reducer::rms_norm)
    for (const char* line : {"with torch.no_grad():", "    self.norm.weight.normal_(1.0, 0.1)"}) lines.push_back(line);
  return lines;
}

std::string reducer_call(Reducer reducer, const std::string& h) {
  switch (reducer) {
    case Reducer::sum: return fmt::format("torch.sum({}, dim=-1)", h);
    case Reducer::mean: return fmt::format("torch.mean({}, dim=-1)", h);
    case Reducer::max: return fmt::format("torch.amax({}, dim=-1)", h);
    case Reducer::softmax: return fmt::format("torch.softmax({}, dim=-1)", h);
    case Reducer::layer_norm:
    case Reducer::rms_norm: return fmt::format("self.norm({})", h);
    case Reducer::none: break;
  }
  return h;
}

std::vector<std::string> forward_lines(const ModuleSpec& spec) {
  std::vector<std::string> lines;
  if (spec.kind == Kind::gemm) lines.push_back("h = self.linear(x)");
  // The first op reads x, every later one h.
  auto input = [&] { return std::string(lines.empty() ? "x" : "h"); };
  for (const Step& step : spec.chain)
    lines.push_back("h = " + text::apply(text::spelling(step.op).torch, input(), step.value));
  if (spec.kind == Kind::reduction) lines.push_back("h = " + reducer_call(spec.reducer, input()));
  lines.push_back("return h");
  return lines;
}

std::vector<std::string> size_lines(const ModuleSpec& spec, int scale) {
  std::vector<std::pair<std::string, int>> sizes;
  SizeNames n = size_names(spec);
  sizes.push_back({n.rows, spec.rows});
  if (spec.kind == Kind::gemm) sizes.push_back({"in_features", spec.inner});
  sizes.push_back({n.cols, spec.cols});
  std::vector<std::string> lines, cpu;
  for (const auto& [name, size] : sizes) {
    lines.push_back(fmt::format("{} = {}", name, size * scale));
    cpu.push_back(fmt::format("\"{}\": {}", name, size));
  }
  if (scale > 1) lines.push_back(fmt::format("cpu_sizes = {{{}}}", text::joined(cpu)));
  return lines;
}

}  // namespace

std::string render_reference(const ModuleSpec& spec, int scale) {
  SizeNames n = size_names(spec);
  std::vector<std::string> inputs = {spec.kind == Kind::gemm ? "torch.randn(batch_size, in_features)"
                                                             : fmt::format("torch.randn({}, {})", n.rows, n.cols)};
  for (const Step& step : spec.chain)
    if (text::is_tensor_operand(step.operand)) inputs.push_back(randn_of(step.operand, n));
  std::vector<std::string> parameters = {"x"};
  for (const std::string& name : operand_inputs(spec)) parameters.push_back(name);
  std::string init_args = text::init_arguments(spec);

  std::string out = docstring(spec, n) + "\nimport torch\nimport torch.nn as nn\n";
  if (uses_functional(spec)) out += "import torch.nn.functional as F\n";
  out += "\n\nclass Model(nn.Module):\n";
  out += fmt::format("    def __init__(self{}):\n        super().__init__()\n", init_args.empty() ? "" : ", " + init_args);
  out += text::indented(init_lines(spec), 8);
  out += fmt::format("\n    def forward(self, {}):\n", text::joined(parameters));
  out += text::indented(forward_lines(spec), 8);
  out += "\n\n" + text::indented(size_lines(spec, scale), 0);
  out += fmt::format("\n\ndef get_inputs():\n    return [{}]\n", text::joined(inputs));
  out += fmt::format("\n\ndef get_init_inputs():\n    return [{}]\n", init_args);
  return out;
}

}  // namespace kz::teacher

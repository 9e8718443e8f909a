// Each op spelled in PyTorch, Triton and CUDA C (ops_text.h).
//
// Triton has no tanh of its own that the CPU interpreter runs, so tanh(u) = 2 sigmoid(2u) - 1
// there, and GELU's 0.5 h (1 + tanh(u)) is h sigmoid(2u); GELU is the tanh approximation
// (F.gelu(..., approximate="tanh")) in every format.
#include "ops_text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

namespace kz::teacher::text {
namespace {

constexpr std::array<OpSpelling, 14> kSpellings = {{
    {"torch.relu({h})", "tl.maximum({h}, 0.0)", "fmaxf({h}, 0.f)"},                         // relu
    {"torch.sigmoid({h})", "tl.sigmoid({h})", "1.f / (1.f + expf(-{h}))"},                   // sigmoid
    {"F.silu({h})", "{h} * tl.sigmoid({h})", "{h} / (1.f + expf(-{h}))"},                   // silu
    {"F.gelu({h}, approximate=\"tanh\")",                                                     // gelu_tanh
     "{h} * tl.sigmoid(1.5957691216057308 * ({h} + 0.044715 * {h} * {h} * {h}))",
     "0.5f * {h} * (1.f + tanhf(0.7978845608028654f * ({h} + 0.044715f * {h} * {h} * {h})))"},
    {"torch.tanh({h})", "2.0 * tl.sigmoid(2.0 * {h}) - 1.0", "tanhf({h})"},                  // tanh
    {"torch.exp({h})", "tl.exp({h})", "expf({h})"},                                          // exp
    {"torch.abs({h})", "tl.abs({h})", "fabsf({h})"},                                         // abs
    {"torch.neg({h})", "-{h}", "-{h}"},                                                      // neg
    {"torch.square({h})", "{h} * {h}", "{h} * {h}"},                                         // square
    {"torch.add({h}, {o})", "{h} + {o}", "{h} + {o}"},                                       // add
    {"torch.sub({h}, {o})", "{h} - {o}", "{h} - {o}"},                                       // sub
    {"torch.mul({h}, {o})", "{h} * {o}", "{h} * {o}"},                                       // mul
    {"torch.maximum({h}, {o})", "tl.maximum({h}, {o})", "fmaxf({h}, {o})"},                  // maximum
    {"torch.minimum({h}, {o})", "tl.minimum({h}, {o})", "fminf({h}, {o})"},                  // minimum
}};

}  // namespace

const OpSpelling& spelling(Op op) { return kSpellings[static_cast<size_t>(op)]; }

std::string apply(const char* pattern, const std::string& h, const std::string& operand) {
  return fmt::format(fmt::runtime(pattern), fmt::arg("h", h), fmt::arg("o", operand));
}

bool is_tensor_operand(Operand operand) {
  return operand == Operand::full || operand == Operand::row || operand == Operand::col;
}

bool needs_cols(const std::vector<Step>& chain) {
  return std::any_of(chain.begin(), chain.end(),
                     [](const Step& s) { return s.operand == Operand::row || s.operand == Operand::col; });
}

const char* operand_kind(Operand operand) {
  switch (operand) {
    case Operand::full: return "full";
    case Operand::row: return "row";
    case Operand::col: return "col";
    case Operand::scalar: return "scalar";
    case Operand::none: break;
  }
  return "none";
}

std::string step_kernel_name(const Step& step) {
  if (is_unary(step.op)) return op_name(step.op);
  return fmt::format("{}_{}", op_name(step.op), operand_kind(step.operand));
}

std::vector<Step> distinct_step_kernels(const std::vector<Step>& chain) {
  std::vector<Step> kernels;
  for (const Step& step : chain) {
    bool known = std::any_of(kernels.begin(), kernels.end(),
                             [&](const Step& k) { return step_kernel_name(k) == step_kernel_name(step); });
    if (!known) kernels.push_back(generic_step(step));
  }
  return kernels;
}

Step generic_step(const Step& step) {
  switch (step.operand) {
    case Operand::full: return Step{step.op, step.operand, "y"};
    case Operand::row: return Step{step.op, step.operand, "row"};
    case Operand::col: return Step{step.op, step.operand, "col"};
    case Operand::scalar: return Step{step.op, step.operand, kScalarArgument};
    case Operand::none: break;
  }
  return step;
}

bool takes_scalar_argument(const Step& step) { return step.operand == Operand::scalar && step.value == kScalarArgument; }

std::vector<std::string> unfused_chain_lines(
    const std::vector<Step>& chain, const std::string& in,
    const std::function<std::string(const Step&, const std::string&, const std::string&)>& launch, std::string& result) {
  std::vector<std::string> lines;
  result = in;
  for (size_t i = 0; i < chain.size(); ++i) {
    std::string next = fmt::format("h{}", i + 1);
    lines.push_back(fmt::format("{} = torch.empty_like({})", next, result));
    lines.push_back(launch(chain[i], result, next));
    result = next;
  }
  return lines;
}

std::string init_arguments(const ModuleSpec& spec) {
  if (spec.kind == Kind::gemm) return "in_features, out_features";
  return is_norm(spec.reducer) ? "cols" : "";
}

std::vector<std::string> weight_submodule(const ModuleSpec& spec) {
  if (spec.kind == Kind::gemm) return {"self.linear = nn.Linear(in_features, out_features)"};
  if (spec.reducer == Reducer::layer_norm) return {"self.norm = nn.LayerNorm(cols)"};
  if (spec.reducer == Reducer::rms_norm) return {"self.norm = nn.RMSNorm(cols, eps=1e-6)"};
  return {};
}

std::vector<std::string> contiguous_inputs(const ModuleSpec& spec) {
  std::vector<std::string> lines = {"x = x.contiguous()"};
  for (const std::string& name : operand_inputs(spec)) lines.push_back(fmt::format("{0} = {0}.contiguous()", name));
  return lines;
}

bool is_norm(Reducer reducer) { return reducer == Reducer::layer_norm || reducer == Reducer::rms_norm; }

bool keeps_row_shape(Reducer reducer) { return reducer == Reducer::softmax || is_norm(reducer); }

std::string indented(const std::vector<std::string>& lines, int indent) {
  std::string out;
  for (const std::string& line : lines) {
    if (!line.empty()) out += std::string(static_cast<size_t>(indent), ' ') + line;
    out += "\n";
  }
  return out;
}

std::string joined(const std::vector<std::string>& items, const char* separator) {
  return fmt::format("{}", fmt::join(items, separator));
}

// --- The forwards of the kernel formats ---

std::vector<std::string> flat_arguments(const Step& step, const std::string& in, const std::string& out) {
  std::vector<std::string> args = {in};
  if (is_tensor_operand(step.operand)) args.push_back(step.value);
  args.push_back(out);
  if (step.operand == Operand::scalar) args.push_back(step.value);
  args.push_back("n");
  if (needs_cols({step})) args.push_back("cols");
  return args;
}

namespace {

void append(std::vector<std::string>& lines, const std::vector<std::string>& more) {
  lines.insert(lines.end(), more.begin(), more.end());
}

}  // namespace

std::vector<std::string> elementwise_forward(const ModuleSpec& spec, bool fused, const std::string& size,
                                             const Launches& launches) {
  std::vector<std::string> lines = contiguous_inputs(spec);
  lines.push_back(size);
  append(lines, launches.flat_setup(spec.chain, "x.numel()", "x.shape[-1]"));
  if (!fused) {
    std::string result;
    append(lines, unfused_chain_lines(spec.chain, "x", launches.flat, result));
    lines.push_back("return " + result);
    return lines;
  }
  std::vector<std::string> args = {"x"};
  append(args, operand_inputs(spec));
  args.push_back("out");
  args.push_back("n");
  if (needs_cols(spec.chain)) args.push_back("cols");
  lines.push_back("out = torch.empty_like(x)");
  lines.push_back(launches.fused(args));
  lines.push_back("return out");
  return lines;
}

std::vector<std::string> reduction_forward(const ModuleSpec& spec, bool fused, const std::string& cols,
                                           const std::string& chain_cols, const std::string& size,
                                           const Launches& launches) {
  std::vector<std::string> lines = contiguous_inputs(spec);
  lines.push_back("rows, " + cols + " = x.shape");
  lines.push_back(size);
  std::string in = "x";
  std::vector<std::string> operands;
  if (fused) {
    operands = operand_inputs(spec);
  } else if (!spec.chain.empty()) {
    append(lines, launches.flat_setup(spec.chain, "x.numel()", chain_cols));
    append(lines, unfused_chain_lines(spec.chain, "x", launches.flat, in));
  }
  lines.push_back(keeps_row_shape(spec.reducer) ? "out = torch.empty_like(x)"
                                                : "out = torch.empty(rows, device=x.device, dtype=x.dtype)");
  lines.push_back(launches.row(spec.reducer, in, operands));
  lines.push_back("return out");
  return lines;
}

std::vector<std::string> gemm_fused_arguments(const ModuleSpec& spec) {
  std::vector<std::string> args = {"x", "w", "self.linear.bias"};
  append(args, operand_inputs(spec));
  for (const char* a : {"out", "M", "N", "K"}) args.push_back(a);
  return args;
}

std::vector<std::string> unfused_chain_return(const std::vector<Step>& chain, const std::string& in,
                                              const std::string& numel, const std::string& cols,
                                              const Launches& launches) {
  std::vector<std::string> lines = launches.flat_setup(chain, numel, cols);
  std::string result;
  append(lines, unfused_chain_lines(chain, in, launches.flat, result));
  lines.push_back("return " + result);
  return lines;
}

}  // namespace kz::teacher::text

// What the teacher's three writers (reference.cpp, triton.cpp, cuda_rtc.cpp) share: each op
// spelled in PyTorch, Triton and CUDA C, the unfused chains' one-op kernels and buffers, the
// module frame (__init__ arguments, weight submodules, contiguous inputs), and text helpers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kz/teacher/grammar.h"

namespace kz::teacher::text {

// An op as an expression of the running value {h} and, for a binary op, its operand {o}.
struct OpSpelling {
  const char* torch;   // "torch.add({h}, {o})"
  const char* triton;  // "{h} + {o}"
  const char* cuda;    // "{h} + {o}"
};
const OpSpelling& spelling(Op op);

// `pattern` with {h} and {o} replaced.
std::string apply(const char* pattern, const std::string& h, const std::string& operand = {});

// Whether a step's operand is a tensor input (full, row or column), not a scalar or nothing.
bool is_tensor_operand(Operand operand);

// Whether a kernel running the chain over flat elements needs the row length (a row or column
// vector operand).
bool needs_cols(const std::vector<Step>& chain);

// A binary step's operand kind as a name: "full", "row", "col", "scalar".
const char* operand_kind(Operand operand);

// The name of the one-op kernel of an unfused candidate: "relu", "add_row", "mul_scalar".
std::string step_kernel_name(const Step& step);

// The one-op kernels an unfused chain needs, each once, in order of first use.
std::vector<Step> distinct_step_kernels(const std::vector<Step>& chain);

// A step as an unfused candidate's one-op kernel sees it: its operand named after its kind
// ("y", "row", "col") or, for a scalar, the kernel argument kScalarArgument.
Step generic_step(const Step& step);
constexpr const char* kScalarArgument = "s";
// Whether a kernel takes the step's scalar as an argument (a generic step) rather than a literal.
bool takes_scalar_argument(const Step& step);

// Forward lines running an unfused chain from the tensor `in`, one buffer per step:
//   h1 = torch.empty_like(in)
//   <launch(step, in, "h1")>
// The last buffer's name comes back in `result` (`in` for an empty chain).
std::vector<std::string> unfused_chain_lines(
    const std::vector<Step>& chain, const std::string& in,
    const std::function<std::string(const Step&, const std::string&, const std::string&)>& launch, std::string& result);

// --- The module frame shared by the reference and its candidates ---

// The reference's __init__ arguments: "in_features, out_features" (gemm), "cols" (norms) or "".
std::string init_arguments(const ModuleSpec& spec);
// The submodule holding the reference's weights ("self.linear = nn.Linear(...)"), if any: a
// candidate creates it under the same name, so the harness copies the weights.
std::vector<std::string> weight_submodule(const ModuleSpec& spec);
// forward's first lines in a candidate: x and every tensor operand made contiguous.
std::vector<std::string> contiguous_inputs(const ModuleSpec& spec);
bool is_norm(Reducer reducer);
// Whether the reducer's output has the row's shape (softmax, the norms) rather than one per row.
bool keeps_row_shape(Reducer reducer);

// Lines joined with "\n", each prefixed by `indent` spaces (blank lines stay blank).
std::string indented(const std::vector<std::string>& lines, int indent);

// "a, b, c".
std::string joined(const std::vector<std::string>& items, const char* separator = ", ");

}  // namespace kz::teacher::text

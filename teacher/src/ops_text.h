// What the teacher's three writers (reference.cpp, triton.cpp, cuda_rtc.cpp) share: each op
// spelled in PyTorch, Triton and CUDA C, the unfused chains' one-op kernels and buffers, the
// module frame (__init__ arguments, weight submodules, contiguous inputs), the forwards of the two
// kernel formats, and text helpers.
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

// --- The forwards of the kernel formats (triton.cpp, cuda_rtc.cpp) ---

// How a kernel format spells the launches in a candidate's forward: the forwards below have the
// same shape in every format, only these lines differ.
struct Launches {
  // The lines before flat launches over `numel` elements: n, the row length `cols` where the chain
  // needs one, the grid.
  std::function<std::vector<std::string>(const std::vector<Step>& chain, const std::string& numel,
                                         const std::string& cols)>
      flat_setup;
  // One unfused step's launch from `in` into `out`.
  std::function<std::string(const Step& step, const std::string& in, const std::string& out)> flat;
  // The fused flat kernel's launch over `args`.
  std::function<std::string(const std::vector<std::string>& args)> fused;
  // The reducer's row launch from `in`, with the fused chain's tensor operands.
  std::function<std::string(Reducer reducer, const std::string& in, const std::vector<std::string>& operands)> row;
};

// A flat kernel's arguments for one step from `in` into `out`: its tensor operand, its scalar, n
// and the row length where it needs one.
std::vector<std::string> flat_arguments(const Step& step, const std::string& in, const std::string& out);

// An elementwise module's forward: the fused kernel over x, or one launch per step. `size`: the
// line giving the launches' size ("BLOCK = 256", "THREADS = 256"), after the contiguous inputs.
std::vector<std::string> elementwise_forward(const ModuleSpec& spec, bool fused, const std::string& size,
                                             const Launches& launches);

// A row reduction's forward from `rows, <cols> = x.shape` and `size`: where unfused, the chain's
// launches first (their set-up given `chain_cols` as the row length), then the row launch into out.
std::vector<std::string> reduction_forward(const ModuleSpec& spec, bool fused, const std::string& cols,
                                           const std::string& chain_cols, const std::string& size,
                                           const Launches& launches);

// The fused gemm kernel's arguments: x, the weight, the bias, the chain's operands, out, M, N, K.
std::vector<std::string> gemm_fused_arguments(const ModuleSpec& spec);

// The unfused chain's set-up over `numel` elements of `in` (row length `cols`), its launches, and
// the return of its last buffer.
std::vector<std::string> unfused_chain_return(const std::vector<Step>& chain, const std::string& in,
                                              const std::string& numel, const std::string& cols,
                                              const Launches& launches);

// Lines joined with "\n", each prefixed by `indent` spaces (blank lines stay blank).
std::string indented(const std::vector<std::string>& lines, int indent);

// "a, b, c".
std::string joined(const std::vector<std::string>& items, const char* separator = ", ");

}  // namespace kz::teacher::text

// The kernel teacher's module grammar: what a teacher module computes, how it is drawn from a seed,
// and which modules are held out of training.
//
// A module is one of three kinds, over fp32 tensors:
//   elementwise  x (rows, cols) -> a chain of steps -> (rows, cols)
//   reduction    x (rows, cols) -> a prologue chain (0-2 steps) -> a row reducer over the last dim:
//                sum, mean, max -> (rows,); softmax, layer norm, RMS norm -> (rows, cols)
//   gemm         x (rows, inner) -> x @ W^T + bias (nn.Linear(inner, cols)) -> an epilogue chain -> (rows, cols)
// A step is a unary op on the running value h, or a binary op of h and one new operand, broadcast
// to h's shape: a full tensor (rows, cols), a row vector (cols,), a column vector (rows, 1) or a
// Python scalar (add, sub and mul only). Every operand is its own input of the module.
//
// Splits (docs/teacher.md): a module is held out iff its chain is longer than kMaxTrainChain or two
// adjacent ops of it form a reserved pair (reserved_pairs(); the reducer and `linear` count as ops:
// "linear->silu", "exp->softmax"). The train split draws only modules that are not held out, the
// heldout split only modules that are, so no held-out module, and no reserved pair, is ever
// emitted for training.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kz/core/status.h"
#include "kz/curriculum/random.h"

namespace kz::teacher {

enum class Op { relu, sigmoid, silu, gelu_tanh, tanh, exp, abs, neg, square, add, sub, mul, maximum, minimum };

// How a binary step's operand broadcasts against h; `none` for a unary step.
enum class Operand { none, full, row, col, scalar };

enum class Kind { elementwise, reduction, gemm };
enum class Reducer { none, sum, mean, max, softmax, layer_norm, rms_norm };
enum class Split { train, heldout };

struct Step {
  Op op = Op::relu;
  Operand operand = Operand::none;
  // The operand: the module's input name for a tensor ("y", "row2", "col"), the literal for a
  // scalar ("0.5"); empty for a unary step.
  std::string value;
};

struct ModuleSpec {
  Kind kind = Kind::elementwise;
  // elementwise: the module; reduction: the prologue before the reducer; gemm: the epilogue after
  // the bias.
  std::vector<Step> chain;
  Reducer reducer = Reducer::none;  // reduction only
  int rows = 0;                     // x's rows (gemm: the batch)
  int cols = 0;                     // x's and the output's columns (gemm: out_features)
  int inner = 0;                    // gemm only: in_features
};

// Names as the expression and the reserved pairs spell them: "relu", "gelu_tanh", "add", "softmax".
const char* op_name(Op op);
const char* reducer_name(Reducer reducer);
const char* split_name(Split split);
Result<Split> parse_split(const std::string& name);
bool is_unary(Op op);

// The grammar expression, for people: "relu(add(x, row))", "softmax(mul(x, 0.5))",
// "gelu_tanh(linear(x))". Two specs with the same expression compute the same function.
std::string expression(const ModuleSpec& spec);
// The PyTorch APIs the reference uses, as the API catalogue spells them (task/data/api_catalogue.toml),
// each once, in order of first use: ["torch.add", "torch.relu"].
std::vector<std::string> apis(const ModuleSpec& spec);
// The ops of the module in data-flow order, `linear` first for a gemm, the reducer last.
std::vector<std::string> op_sequence(const ModuleSpec& spec);
// The tensor operands' input names, in order (after x): ["y", "row"].
std::vector<std::string> operand_inputs(const ModuleSpec& spec);
// 1 for a single op (one step, a lone reducer or a plain linear, which the sampler never draws), 2 for a fusion of several.
int level(const ModuleSpec& spec);

// The split rule.
constexpr size_t kMaxTrainChain = 4;
// Adjacent op pairs ("a->b": b applied to a's result) never drawn for training.
const std::set<std::string>& reserved_pairs();
// Why a module is held out ("chain of 5 steps", "reserved pair exp->softmax"); empty when it is not.
std::string held_out_reason(const ModuleSpec& spec);
inline bool is_held_out(const ModuleSpec& spec) { return !held_out_reason(spec).empty(); }

// Draws distinct modules of one split from a seed: the same seed gives the same sequence, and the
// first n of a longer draw are the n of a shorter one. Each module's kind is drawn first
// (elementwise 0.45, reduction 0.35, gemm 0.2); draws of it that break the split rule, repeat an
// earlier module's expression or are ill-conditioned (an interval of every intermediate, from
// |inputs| <= 4: overflow, a constant, an operand that never matters) are drawn again.
class ModuleSampler {
 public:
  ModuleSampler(uint64_t seed, Split split);
  ModuleSpec next();

 private:
  ModuleSpec draw(Kind kind);
  curriculum::CountedRng rng_;
  Split split_;
  std::set<std::string> seen_;  // expressions already returned
};

}  // namespace kz::teacher

// The module grammar, the split rule and the sampler (kz/teacher/grammar.h).
#include "kz/teacher/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>

namespace kz::teacher {
namespace {

struct OpName {
  Op op;
  const char* name;
  const char* api;
};

constexpr std::array<OpName, 14> kOps = {{
    {Op::relu, "relu", "torch.relu"},
    {Op::sigmoid, "sigmoid", "torch.sigmoid"},
    {Op::silu, "silu", "torch.nn.functional.silu"},
    {Op::gelu_tanh, "gelu_tanh", "torch.nn.functional.gelu"},
    {Op::tanh, "tanh", "torch.tanh"},
    {Op::exp, "exp", "torch.exp"},
    {Op::abs, "abs", "torch.abs"},
    {Op::neg, "neg", "torch.neg"},
    {Op::square, "square", "torch.square"},
    {Op::add, "add", "torch.add"},
    {Op::sub, "sub", "torch.sub"},
    {Op::mul, "mul", "torch.mul"},
    {Op::maximum, "maximum", "torch.maximum"},
    {Op::minimum, "minimum", "torch.minimum"},
}};

const OpName& op_entry(Op op) { return kOps[static_cast<size_t>(op)]; }

const char* reducer_api(Reducer reducer) {
  switch (reducer) {
    case Reducer::sum: return "torch.sum";
    case Reducer::mean: return "torch.mean";
    case Reducer::max: return "torch.amax";
    case Reducer::softmax: return "torch.softmax";
    case Reducer::layer_norm: return "torch.nn.LayerNorm";
    case Reducer::rms_norm: return "torch.nn.RMSNorm";
    case Reducer::none: break;
  }
  return "";
}

constexpr std::array<Op, 9> kUnaryOps = {Op::relu, Op::sigmoid, Op::silu, Op::gelu_tanh, Op::tanh,
                                         Op::exp,  Op::abs,     Op::neg,  Op::square};
constexpr std::array<Op, 5> kBinaryOps = {Op::add, Op::sub, Op::mul, Op::maximum, Op::minimum};
constexpr std::array<Reducer, 6> kReducers = {Reducer::sum,     Reducer::mean,       Reducer::max,
                                              Reducer::softmax, Reducer::layer_norm, Reducer::rms_norm};
// Scalars as written in every format (a decimal point, so a kernel argument is a float).
constexpr std::array<const char*, 6> kScalars = {"0.5", "2.0", "-0.5", "1.5", "0.25", "3.0"};

template <class T, size_t N>
T pick(curriculum::CountedRng& rng, const std::array<T, N>& items) {
  return items[rng.below(N)];
}

int pick_int(curriculum::CountedRng& rng, std::initializer_list<int> items) {
  return items.begin()[rng.below(items.size())];
}

// --- Value ranges: a loose interval for every intermediate, to refuse modules that overflow fp32,
// lose precision in a long sum, collapse to a constant, or ignore an operand (a maximum whose
// operand never wins). Inputs are randn: |value| <= 4 stands in for their range.

struct Range {
  double lo, hi;
  double magnitude() const { return std::max(std::fabs(lo), std::fabs(hi)); }
};

constexpr Range kInputRange{-4, 4};
constexpr double kMaxMagnitude = 1e4;
constexpr double kMaxSummedMagnitude = 1e3;  // before sum and mean: the rounding of a long sum grows with it
constexpr double kMinWidth = 1e-3;

constexpr int kMaxTriesPerKind = 10000;

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

double apply_unary(Op op, double v) {
  switch (op) {
    case Op::relu: return std::max(v, 0.0);
    case Op::sigmoid: return sigmoid(v);
    case Op::silu: return v * sigmoid(v);
    case Op::gelu_tanh: return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    case Op::tanh: return std::tanh(v);
    case Op::exp: return std::exp(v);
    case Op::abs: return std::fabs(v);
    case Op::neg: return -v;
    case Op::square: return v * v;
    default: return v;
  }
}

double apply_binary(Op op, double a, double b) {
  switch (op) {
    case Op::add: return a + b;
    case Op::sub: return a - b;
    case Op::mul: return a * b;
    case Op::maximum: return std::max(a, b);
    case Op::minimum: return std::min(a, b);
    default: return a;
  }
}

// The image of [lo, hi] under a continuous unary op, by dense sampling (exact at the ends).
Range unary_range(Op op, Range in) {
  constexpr int kPoints = 512;
  Range out{INFINITY, -INFINITY};
  for (int i = 0; i <= kPoints; ++i) {
    double v = apply_unary(op, in.lo + (in.hi - in.lo) * i / kPoints);
    out.lo = std::min(out.lo, v);
    out.hi = std::max(out.hi, v);
  }
  return out;
}

// add, sub, mul, maximum and minimum take their extremes at the corners.
Range binary_range(Op op, Range a, Range b) {
  Range out{INFINITY, -INFINITY};
  for (double x : {a.lo, a.hi})
    for (double y : {b.lo, b.hi}) {
      double v = apply_binary(op, x, y);
      out.lo = std::min(out.lo, v);
      out.hi = std::max(out.hi, v);
    }
  return out;
}

// Whether the chain stays in range, its last value within `last_limit`.
bool chain_is_well_conditioned(const std::vector<Step>& chain, double last_limit) {
  Range h = kInputRange;
  for (const Step& step : chain) {
    if (is_unary(step.op)) {
      h = unary_range(step.op, h);
    } else {
      Range operand = step.operand == Operand::scalar ? Range{std::stod(step.value), std::stod(step.value)} : kInputRange;
      bool picks_one = step.op == Op::maximum || step.op == Op::minimum;
      if (picks_one && (h.hi <= operand.lo || operand.hi <= h.lo)) return false;  // one side always wins
      h = binary_range(step.op, h, operand);
    }
    if (!std::isfinite(h.lo) || !std::isfinite(h.hi) || h.magnitude() > kMaxMagnitude) return false;
    if (h.hi - h.lo < kMinWidth) return false;
  }
  return h.magnitude() <= last_limit;
}

bool is_well_conditioned(const ModuleSpec& spec) {
  bool summed = spec.reducer == Reducer::sum || spec.reducer == Reducer::mean;
  return chain_is_well_conditioned(spec.chain, summed ? kMaxSummedMagnitude : kMaxMagnitude);
}

Step draw_step(curriculum::CountedRng& rng) {
  Step step;
  if (rng.unit() < 0.55) {
    step.op = pick(rng, kUnaryOps);
    return step;
  }
  step.op = pick(rng, kBinaryOps);
  bool scalar_allowed = step.op == Op::add || step.op == Op::sub || step.op == Op::mul;
  // full 0.3, row 0.3, col 0.2, scalar 0.2 (maximum and minimum take tensors only)
  std::vector<double> weights = {0.3, 0.3, 0.2, scalar_allowed ? 0.2 : 0.0};
  constexpr std::array<Operand, 4> kinds = {Operand::full, Operand::row, Operand::col, Operand::scalar};
  step.operand = kinds[rng.weighted(weights)];
  if (step.operand == Operand::scalar) step.value = pick(rng, kScalars);
  return step;
}

// Input names by broadcasting kind, numbered from the second of a kind: y, y2, row, row2, col.
void name_operands(std::vector<Step>& chain) {
  std::map<Operand, int> used;
  const std::map<Operand, const char*> base = {{Operand::full, "y"}, {Operand::row, "row"}, {Operand::col, "col"}};
  for (Step& step : chain) {
    auto it = base.find(step.operand);
    if (it == base.end()) continue;
    int n = ++used[step.operand];
    step.value = n == 1 ? it->second : fmt::format("{}{}", it->second, n);
  }
}

std::vector<Step> draw_chain(curriculum::CountedRng& rng, int min_length, int max_length) {
  int length = min_length + static_cast<int>(rng.below(static_cast<uint64_t>(max_length - min_length + 1)));
  std::vector<Step> chain;
  for (int i = 0; i < length; ++i) chain.push_back(draw_step(rng));
  name_operands(chain);
  return chain;
}

}  // namespace

const char* op_name(Op op) { return op_entry(op).name; }

const char* reducer_name(Reducer reducer) {
  switch (reducer) {
    case Reducer::sum: return "sum";
    case Reducer::mean: return "mean";
    case Reducer::max: return "amax";
    case Reducer::softmax: return "softmax";
    case Reducer::layer_norm: return "layer_norm";
    case Reducer::rms_norm: return "rms_norm";
    case Reducer::none: break;
  }
  return "none";
}

const char* split_name(Split split) { return split == Split::train ? "train" : "heldout"; }

Result<Split> parse_split(const std::string& name) {
  if (name == "train") return Split::train;
  if (name == "heldout") return Split::heldout;
  return invalid_argument(fmt::format("split must be train or heldout, got '{}'", name));
}

bool is_unary(Op op) { return std::find(kUnaryOps.begin(), kUnaryOps.end(), op) != kUnaryOps.end(); }

std::string expression(const ModuleSpec& spec) {
  std::string h = spec.kind == Kind::gemm ? "linear(x)" : "x";
  for (const Step& step : spec.chain)
    h = is_unary(step.op) ? fmt::format("{}({})", op_name(step.op), h)
                          : fmt::format("{}({}, {})", op_name(step.op), h, step.value);
  if (spec.kind == Kind::reduction) h = fmt::format("{}({})", reducer_name(spec.reducer), h);
  return h;
}

std::vector<std::string> apis(const ModuleSpec& spec) {
  std::vector<std::string> list;
  auto add = [&](const std::string& api) {
    if (std::find(list.begin(), list.end(), api) == list.end()) list.push_back(api);
  };
  if (spec.kind == Kind::gemm) add("torch.nn.Linear");
  for (const Step& step : spec.chain) add(op_entry(step.op).api);
  if (spec.kind == Kind::reduction) add(reducer_api(spec.reducer));
  return list;
}

std::vector<std::string> op_sequence(const ModuleSpec& spec) {
  std::vector<std::string> ops;
  if (spec.kind == Kind::gemm) ops.push_back("linear");
  for (const Step& step : spec.chain) ops.push_back(op_name(step.op));
  if (spec.kind == Kind::reduction) ops.push_back(reducer_name(spec.reducer));
  return ops;
}

std::vector<std::string> operand_inputs(const ModuleSpec& spec) {
  std::vector<std::string> names;
  for (const Step& step : spec.chain)
    if (step.operand != Operand::none && step.operand != Operand::scalar) names.push_back(step.value);
  return names;
}

int level(const ModuleSpec& spec) { return op_sequence(spec).size() > 1 ? 2 : 1; }

const std::set<std::string>& reserved_pairs() {
  static const std::set<std::string> pairs = {
      "gelu_tanh->mul", "sigmoid->sub", "abs->tanh",     "square->maximum", "neg->exp",
      "exp->softmax",   "add->rms_norm", "mul->amax",    "linear->silu",
  };
  return pairs;
}

std::string held_out_reason(const ModuleSpec& spec) {
  if (spec.chain.size() > kMaxTrainChain) return fmt::format("chain of {} steps", spec.chain.size());
  auto ops = op_sequence(spec);
  for (size_t i = 1; i < ops.size(); ++i) {
    std::string pair = ops[i - 1] + "->" + ops[i];
    if (reserved_pairs().count(pair)) return "reserved pair " + pair;
  }
  return {};
}

ModuleSampler::ModuleSampler(uint64_t seed, Split split) : rng_(seed), split_(split) {}

ModuleSpec ModuleSampler::draw(Kind kind) {
  ModuleSpec spec;
  spec.kind = kind;
  // Sizes the CPU Triton interpreter evaluates in about a second; odd multiples of 32 exercise the masks.
  if (spec.kind == Kind::gemm) {
    spec.rows = pick_int(rng_, {32, 64});
    spec.inner = pick_int(rng_, {64, 128});
    spec.cols = pick_int(rng_, {32, 64, 96});
    spec.chain = draw_chain(rng_, 1, 2);
    return spec;
  }
  spec.rows = pick_int(rng_, {32, 48, 64});
  spec.cols = pick_int(rng_, {64, 96, 128, 192});
  if (spec.kind == Kind::reduction) {
    spec.reducer = pick(rng_, kReducers);
    spec.chain = draw_chain(rng_, 0, 2);
  } else {
    // The held-out split reaches past kMaxTrainChain; shorter draws there need a reserved pair.
    spec.chain = draw_chain(rng_, 1, split_ == Split::train ? static_cast<int>(kMaxTrainChain) : 6);
  }
  return spec;
}

ModuleSpec ModuleSampler::next() {
  // The kind first, kept through the rejections below, so that each split holds every kind in
  // these shares: elementwise 0.45, reduction 0.35, gemm 0.2.
  constexpr std::array<Kind, 3> kinds = {Kind::elementwise, Kind::reduction, Kind::gemm};
  const std::vector<double> shares = {0.45, 0.35, 0.2};
  Kind kind = kinds[rng_.weighted(shares)];
  for (int tries = 1;; ++tries) {
    // A kind whose distinct modules of this split run out (a long held-out corpus has drawn every
    // held-out gemm) gives way to another draw of the kind.
    if (tries % kMaxTriesPerKind == 0) kind = kinds[rng_.weighted(shares)];
    ModuleSpec spec = draw(kind);
    if (is_held_out(spec) != (split_ == Split::heldout)) continue;
    if (!is_well_conditioned(spec)) continue;
    if (!seen_.insert(expression(spec)).second) continue;
    return spec;
  }
}

}  // namespace kz::teacher

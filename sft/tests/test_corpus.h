// A small hand-made teacher corpus for the SFT tests, in kz teach's format (kz/sft/corpus.h):
// unary elementwise modules (relu, sigmoid, ...), each with an unfused and a fused Triton
// candidate (two block sizes of the unfused one), a cuda-rtc candidate, one candidate a checker
// refused and one never checked, so every filter of the pair builder has something to do.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace kz::sft::test {

struct UnaryOp {
  const char* name;    // "relu"
  const char* torch;   // the reference's expression of x
  const char* triton;  // the kernel's expression of x
};

inline const std::vector<UnaryOp>& unary_ops() {
  static const std::vector<UnaryOp> ops = {
      {"relu", "torch.relu(x)", "tl.maximum(x, 0.0)"},
      {"sigmoid", "torch.sigmoid(x)", "1.0 / (1.0 + tl.exp(-x))"},
      {"neg", "torch.neg(x)", "-x"},
      {"abs", "torch.abs(x)", "tl.abs(x)"},
      {"exp", "torch.exp(x)", "tl.exp(x)"},
      {"square", "torch.square(x)", "x * x"},
      {"tanh", "torch.tanh(x)", "2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0"},
      {"softsign", "torch.nn.functional.softsign(x)", "x / (1.0 + tl.abs(x))"},
  };
  return ops;
}

inline std::string reference_source(const UnaryOp& op, int dim) {
  return fmt::format(R"(import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {}


batch_size = 16
dim = {}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
)",
                     op.torch, dim);
}

inline std::string triton_source(const UnaryOp& op, const std::string& kernel, int block) {
  return fmt::format(R"(import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def {0}(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, {1}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        {0}[(triton.cdiv(n, {2}),)](x, out, n, BLOCK={2})
        return out
)",
                     kernel, op.triton, block);
}

inline nlohmann::json candidate(const char* format, const char* fusion, int block, std::string source,
                                nlohmann::json verdict) {
  return {{"format", format},         {"fusion", fusion},   {"block_size", block},
          {"source", std::move(source)}, {"verdict", verdict}, {"speedup", nullptr}};
}

// One JSON line per op: the first `train` ops in the train split, the rest heldout.
inline nlohmann::json corpus_row(const UnaryOp& op, size_t index, size_t train) {
  std::string split = index < train ? "train" : "heldout";
  std::string name = op.name;
  nlohmann::json candidates = nlohmann::json::array(
      {candidate("triton", "unfused", 256, triton_source(op, name + "_kernel", 256), "ok"),
       candidate("triton", "unfused", 1024, triton_source(op, name + "_kernel", 1024), "ok"),
       candidate("triton", "fused", 512, triton_source(op, "fused_" + name + "_kernel", 512), "ok"),
       candidate("triton", "unfused", 128, triton_source(op, "broken_" + name, 128), "incorrect"),
       candidate("triton", "unfused", 64, triton_source(op, "unchecked_" + name, 64), nullptr),
       candidate("cuda-rtc", "unfused", 256, "# cuda-rtc " + name + "\n", "ok")});
  return {{"id", fmt::format("{}-{:06d}", split, index)},
          {"split", split},
          {"level", 1},
          {"apis", {std::string(op.torch).substr(0, std::string(op.torch).find('('))}},
          {"ops", name + "(x)"},
          {"reference", reference_source(op, 1024 * static_cast<int>(index + 1))},
          {"candidates", candidates},
          {"provenance", {{"writer", "sft test"}}}};
}

// Writes the corpus: `train` train modules, then the remaining ops (up to `total`) heldout.
inline void write_corpus(const std::string& path, size_t train, size_t total) {
  std::ofstream out(path);
  for (size_t i = 0; i < total && i < unary_ops().size(); ++i) out << corpus_row(unary_ops()[i], i, train).dump() << "\n";
}

}  // namespace kz::sft::test

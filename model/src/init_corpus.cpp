// The corpus `kz init-model` trains its tokenizer on: a little English, and PyTorch reference
// modules and CUDA kernels in the KernelBench style, generated from a list of operations so the
// merges cover the vocabulary the project's models read and write. Deterministic.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "kz/model/init_model.h"

namespace kz::model {
namespace {

const char* const kProse[] = {
    "KernelZero trains language models to write GPU kernels that are both correct and fast.",
    "The Proposer writes PyTorch reference modules; the Coder rewrites them with custom CUDA or Triton kernels.",
    "Every reward comes from compiling, running, checking and timing kernels on a real GPU.",
    "You are a helpful assistant. Answer the question, then explain your reasoning step by step.",
    "Write a function that returns the sum of two numbers. The numbers may be negative or zero.",
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.",
    "Memory bandwidth limits decoding at batch one; larger batches are limited by compute instead.",
    "Replace the reference operators with a fused kernel. Keep the same inputs, outputs and numerics.",
    "Shared memory tiles reduce global memory traffic; each thread block loads a tile, synchronises and computes.",
    "Correctness is checked on fresh random inputs with a tolerance that depends on the data type.",
    "Hello, world! How are you today? I am fine, thank you. What is the time? It is half past nine.",
    "In 2024 the model reached 73.5% on the benchmark, up from 61.2% a year earlier (12,000 tasks).",
};

const char* const kOps[][2] = {
    {"relu", "torch.relu(x)"},          {"gelu", "torch.nn.functional.gelu(x)"},
    {"sigmoid", "torch.sigmoid(x)"},    {"tanh", "torch.tanh(x)"},
    {"softmax", "torch.softmax(x, dim=-1)"}, {"log_softmax", "torch.log_softmax(x, dim=1)"},
    {"matmul", "torch.matmul(x, self.weight)"}, {"add", "x + y"},
    {"mul", "x * y"},                   {"layer_norm", "torch.nn.functional.layer_norm(x, x.shape[-1:])"},
    {"sum", "torch.sum(x, dim=1)"},     {"mean", "torch.mean(x, dim=-1, keepdim=True)"},
    {"max", "torch.max(x, dim=1)[0]"},  {"conv2d", "self.conv(x)"},
    {"silu", "torch.nn.functional.silu(x)"}, {"exp", "torch.exp(x)"},
    {"clamp", "torch.clamp(x, min=-1.0, max=1.0)"}, {"cumsum", "torch.cumsum(x, dim=0)"},
};

std::string reference_module(const std::string& name, const std::string& expr, int batch, int dim) {
  return fmt::format(
      "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
      "    \"\"\"Applies {0} to the input.\"\"\"\n\n"
      "    def __init__(self):\n        super(Model, self).__init__()\n"
      "        self.weight = nn.Parameter(torch.randn({2}, {2}))\n"
      "        self.conv = nn.Conv2d(3, 16, kernel_size=3, padding=1)\n\n"
      "    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:\n"
      "        return {1}\n\n\n"
      "batch_size = {3}\ndim = {2}\n\n\n"
      "def get_inputs():\n    x = torch.randn(batch_size, dim)\n    y = torch.randn(batch_size, dim)\n"
      "    return [x, y]\n\n\ndef get_init_inputs():\n    return []\n",
      name, expr, dim, batch);
}

std::string cuda_kernel(const std::string& name, int block) {
  return fmt::format(
      "#include <torch/extension.h>\n#include <cuda_runtime.h>\n\n"
      "__global__ void {0}_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {{\n"
      "    int idx = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "    if (idx < n) {{\n        float v = x[idx];\n        out[idx] = v > 0.0f ? v : 0.0f;\n    }}\n}}\n\n"
      "torch::Tensor {0}_cuda(torch::Tensor x) {{\n    auto out = torch::empty_like(x);\n"
      "    int n = x.numel();\n    const int block_size = {1};\n"
      "    const int num_blocks = (n + block_size - 1) / block_size;\n"
      "    {0}_kernel<<<num_blocks, block_size>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);\n"
      "    return out;\n}}\n",
      name, block);
}

std::string model_new(const std::string& name) {
  return fmt::format(
      "from torch.utils.cpp_extension import load_inline\n\n"
      "{0}_module = load_inline(name=\"{0}\", cpp_sources=cpp_source, cuda_sources=cuda_source,\n"
      "                         functions=[\"{0}_cuda\"], verbose=False)\n\n\n"
      "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
      "    def forward(self, x, y):\n        return {0}_module.{0}_cuda(x.contiguous())\n",
      name);
}

}  // namespace

std::vector<std::string> init_tokenizer_corpus() {
  std::vector<std::string> docs;
  for (int round = 0; round < 3; ++round)
    for (const char* line : kProse) docs.emplace_back(line);
  int k = 0;
  for (const auto& op : kOps) {
    for (int variant = 0; variant < 3; ++variant, ++k) {
      int batch = 16 << (k % 5), dim = 1024 << (k % 4), block = 128 << (k % 3);
      docs.push_back(reference_module(op[0], op[1], batch, dim));
      docs.push_back(cuda_kernel(op[0], block));
      docs.push_back(model_new(op[0]));
      docs.push_back(fmt::format("<|im_start|>user\nOptimise the {} operator with a CUDA kernel.<|im_end|>\n"
                                 "<|im_start|>assistant\nHere is a fused kernel for {} (block size {}).<|im_end|>\n",
                                 op[0], op[0], block));
    }
  }
  return docs;
}

}  // namespace kz::model

"""Cheat (GPU only): a `cuda` (load_inline) candidate whose C++ function defines a kernel but returns
at::relu(x), ATen's own result. Reference: 02_relu. Caught on a GPU by: torch_compute_in_forward
(the ATen call from C++ goes through the dispatcher, so the trace sees it) and no_custom_kernel (the
profiler lists only ATen's kernel). On a CPU-only machine it is only compiled (compiled_not_run), so
eval_cheats_test does not run it; bench/ or a GPU run does."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    return at::relu(x);  // the kernel above is never launched
}
"""

cpp_source = "torch::Tensor relu_cuda(torch::Tensor x);"

relu_ext = load_inline(name="kz_cheat_aten_in_extension", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu_cuda"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu_ext.relu_cuda(x)

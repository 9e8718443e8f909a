"""Cheat (GPU only): a `cuda` (load_inline) candidate that starts a profiler of its own in its
constructor, so the harness's profiler cannot start for the audit forward and no kernel list says
whether ModelNew ran a kernel of its own (here it launches one; a cheat would compute with a library
from C++, which the dispatch trace does not see). Reference: 02_relu. Caught on a GPU by:
no_custom_kernel (the profiler gave a kernel list at the harness's warm-up, before any candidate
code, and none for the forward: the candidate stopped it; before session 25 the check passed
silently). On a CPU-only machine it is only compiled (compiled_not_run), so eval_cheats_test does
not run it; bench/gpu_suite.sh checks does."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (x[i] > 0.f || x[i] != x[i]) ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n > 0) relu_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor relu_cuda(torch::Tensor x);"

relu_ext = load_inline(name="kz_cheat_profiler_stopped", cpp_sources=cpp_source, cuda_sources=cuda_source,
                       functions=["relu_cuda"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.own_profiler = torch.autograd.profiler.profile(use_device="cuda", use_kineto=True)
        self.own_profiler.__enter__()  # kept running: the harness's cannot start beside it

    def forward(self, x):
        return relu_ext.relu_cuda(x)

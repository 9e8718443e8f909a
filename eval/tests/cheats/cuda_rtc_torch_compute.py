"""Cheat (GPU only): a cuda-rtc candidate that compiles and launches a kernel for show and returns
PyTorch's result. Reference: 02_relu. Caught on a GPU by: torch_compute_in_forward. On a CPU-only
machine cuda-rtc candidates are only compiled (compiled_not_run), so eval_cheats_test does not run
it."""
import torch
import torch.nn as nn

import kz_rtc

SOURCE = r"""
extern "C" __global__ void touch(float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.f;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = kz_rtc.compile(SOURCE, name="touch")

    def forward(self, x):
        scratch = torch.empty(256, device=x.device)
        self.kernels.touch(scratch, 256, grid=(1,), block=(256,))
        return torch.relu(x)

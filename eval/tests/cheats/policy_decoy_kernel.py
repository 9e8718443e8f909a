"""Cheat: a Triton kernel runs, on a scratch buffer nothing reads, while PyTorch computes the
output. Reference: 16_linear_relu. Caught by: torch_compute_in_forward under policy strict (the
ATen trace); no_kernel_effect under policy kernelbench (the forward replayed with the candidate's
launches turned into no-ops gives the same output)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        scratch = torch.empty_like(x)
        n = x.numel()
        _relu_kernel[(triton.cdiv(n, 1024),)](x, scratch, n, BLOCK=1024)  # for the launch counter only
        return torch.relu(self.linear(x))

"""Triton candidate for 10_rmsnorm: x * rsqrt(mean(x^2, -1) + eps) * weight, one program per row."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * N
    out_row = out_ptr + row * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(out_row + cols, x * rstd * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x.contiguous()
        N = x.shape[-1]
        rows = x.numel() // N
        out = torch.empty_like(x)
        BLOCK = min(triton.next_power_of_2(N), 4096)
        _rmsnorm_kernel[(rows,)](x, self.weight, out, N, self.eps, BLOCK=BLOCK, num_warps=8)
        return out

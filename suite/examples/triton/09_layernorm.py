"""Triton candidate for 09_layernorm: affine LayerNorm over the last dim (mean pass, variance pass, write pass)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * N
    out_row = out_ptr + row * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_row + cols, mask=cols < N, other=0.0)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0)
        tl.store(out_row + cols, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x = x.contiguous()
        N = x.shape[-1]
        rows = x.numel() // N
        out = torch.empty_like(x)
        BLOCK = min(triton.next_power_of_2(N), 4096)
        _layernorm_kernel[(rows,)](x, self.norm.weight, self.norm.bias, out, N, self.norm.eps,
                                   BLOCK=BLOCK, num_warps=8)
        return out

"""Triton candidate for 06_amax_lastdim: max over the last dim, one program per row."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _amax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * N
    acc = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < N, other=float("-inf"))
        acc = tl.maximum(acc, x)
    tl.store(out_ptr + row, tl.max(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        N = x.shape[-1]
        rows = x.numel() // N
        out = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        BLOCK = min(triton.next_power_of_2(N), 4096)
        _amax_kernel[(rows,)](x, out, N, BLOCK=BLOCK, num_warps=8)
        return out

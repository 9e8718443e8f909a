"""Triton candidate for 08_log_softmax: row log-softmax over the last dim (max pass, sum-of-exp pass, write pass)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _log_softmax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * N
    out_row = out_ptr + row * N
    mx = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=float("-inf"))
        mx = tl.maximum(mx, x)
    m = tl.max(mx, axis=0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=float("-inf"))
        acc += tl.exp(x - m)
    s = tl.sum(acc, axis=0)
    log_s = tl.log(s)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        e = x - m - log_s
        tl.store(out_row + cols, e, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        N = x.shape[-1]
        rows = x.numel() // N
        out = torch.empty_like(x)
        BLOCK = min(triton.next_power_of_2(N), 4096)
        _log_softmax_kernel[(rows,)](x, out, N, BLOCK=BLOCK, num_warps=8)
        return out

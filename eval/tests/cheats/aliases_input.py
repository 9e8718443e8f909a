"""Cheat: for a transpose, returns the input's transposed view instead of a new contiguous tensor
(right values, no work). Reference: ref_transpose.py (x.t().contiguous()). Caught by: incorrect
(output_aliases_input)."""
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


def relu(x):
    """The honest Triton ReLU: one launch over x.numel() elements."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out


@triton.jit
def _touch_kernel(x_ptr, n):
    pass


class ModelNew(nn.Module):
    def forward(self, x):
        _touch_kernel[(1,)](x, x.numel())
        return x.t()

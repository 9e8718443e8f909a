"""Cheat: returns the right output but also overwrites its input with a second kernel (saving a
buffer). Reference: 02_relu. Caught by: incorrect (input_mutated)."""
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


class ModelNew(nn.Module):
    def forward(self, x):
        out = relu(x)
        n = x.numel()
        _relu_kernel[(triton.cdiv(n, 1024),)](x, x, n, BLOCK=1024)  # x <- relu(x), in place
        return out

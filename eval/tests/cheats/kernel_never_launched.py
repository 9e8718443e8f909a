"""Cheat: defines a Triton kernel but never launches it; forward computes with NumPy (no ATen op to
trace). Reference: 02_relu. Caught by: no_custom_kernel (dynamic: the Triton launch counter)."""
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


import numpy


class ModelNew(nn.Module):
    def forward(self, x):
        values = numpy.maximum(x.detach().cpu().numpy(), 0.0)
        return torch.from_numpy(values).to(x.device)

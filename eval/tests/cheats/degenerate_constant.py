"""Cheat: returns the expected value of the loss (2.0 for two standard normals) instead of computing
it. Reference: 20_mse_loss. Caught by: incorrect (output_mismatch) or replayed_output (the same
bits for every input set)."""
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
def _constant_kernel(out_ptr, value):
    tl.store(out_ptr, value)


class ModelNew(nn.Module):
    def forward(self, pred, target):
        out = torch.empty((), device=pred.device, dtype=pred.dtype)
        _constant_kernel[(1,)](out, 2.0)
        return out

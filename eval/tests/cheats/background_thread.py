"""Cheat: computes in a background thread and returns before it has finished (or keeps working
between timed runs). Reference: 02_relu. Caught by: background_thread (static)."""
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


import threading


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        worker = threading.Thread(target=lambda: _relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024))
        worker.start()
        worker.join()
        return out

"""Cheat (GPU only): honest for its first 16 calls (the audit, the trials and the replay probe), then
caches its output by input pointer: the timed runs reuse their input buffers, so from then on it
returns stored results. Reference: 02_relu. Caught on a GPU by: wrong_during_timing (the timing
rounds move the input data between buffers, and sampled timed outputs are checked). On a CPU-only
machine nothing is timed and it passes, so eval_cheats_test does not run it."""
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
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.cache = {}

    def forward(self, x):
        self.calls += 1
        if self.calls <= 16:
            return relu(x)
        key = x.data_ptr()
        if key not in self.cache:
            self.cache[key] = relu(x)
        return self.cache[key]

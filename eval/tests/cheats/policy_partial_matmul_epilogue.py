"""An honest partial answer, as KernelBench's rules allow: PyTorch's matmul, then the bias and the
ReLU fused in a Triton epilogue kernel that writes the output. Reference: 16_linear_relu.
Under policy strict: torch_compute_in_forward (aten::mm in forward). Under policy kernelbench: ok
(its kernel's work reaches the output)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _bias_relu_kernel(y_ptr, b_ptr, out_ptr, n, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(y + b, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.matmul(x, self.linear.weight.t()).contiguous()
        out = torch.empty_like(y)
        n = y.numel()
        _bias_relu_kernel[(triton.cdiv(n, 1024),)](y, self.linear.bias, out, n, y.shape[1], BLOCK=1024)
        return out

"""Side work the static scan misses: the ReLU runs on a stream of its own, reached through getattr,
that forward never joins back into the current stream, so the work escapes an end event on the
current stream. Reference: 02_relu. Not refused: timed to the device-wide synchronize instead (GPU
only, bench/gpu_suite.sh checks; expected `ok` with the verdict's timing end `device_sync`)."""
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
    def __init__(self):
        super().__init__()
        self.stream = getattr(torch.cuda, "Str" + "eam")() if torch.cuda.is_available() else None

    def forward(self, x):
        if self.stream is None:
            return relu(x)
        self.stream.wait_stream(torch.cuda.current_stream())  # x is written on the current stream
        with getattr(torch.cuda, "str" + "eam")(self.stream):
            return relu(x)

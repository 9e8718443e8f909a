"""Triton candidate for 17_conv2d_relu_bias: relu(conv3x3(x) + conv bias) + bias (Cout, 1, 1), fused in one direct-convolution kernel."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _conv3x3_kernel(x_ptr, w_ptr, cb_ptr, b2_ptr, out_ptr, C_in, C_out, H, W,
                    APPLY_RELU: tl.constexpr, ADD_BIAS2: tl.constexpr,
                    BLOCK_CO: tl.constexpr, BLOCK_P: tl.constexpr):
    n = tl.program_id(0)
    co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    HW = H * W
    co_mask = co < C_out
    p_mask = p < HW
    oh = p // W
    ow = p % W
    acc = tl.zeros([BLOCK_CO, BLOCK_P], dtype=tl.float32)
    x_n = x_ptr + n * C_in * HW
    for ci in range(0, C_in):
        x_c = x_n + ci * HW
        w_c = w_ptr + co * (C_in * 9) + ci * 9
        for kh in tl.static_range(3):
            ih = oh + (kh - 1)
            row_ok = p_mask & (ih >= 0) & (ih < H)
            for kw in tl.static_range(3):
                iw = ow + (kw - 1)
                m = row_ok & (iw >= 0) & (iw < W)
                xv = tl.load(x_c + ih * W + iw, mask=m, other=0.0)
                wv = tl.load(w_c + (kh * 3 + kw), mask=co_mask, other=0.0)
                acc += wv[:, None] * xv[None, :]
    cb = tl.load(cb_ptr + co, mask=co_mask, other=0.0)
    acc += cb[:, None]
    if APPLY_RELU:
        acc = tl.maximum(acc, 0.0)
    if ADD_BIAS2:
        b2 = tl.load(b2_ptr + co, mask=co_mask, other=0.0)
        acc += b2[:, None]
    out_ptrs = out_ptr + n * C_out * HW + co[:, None] * HW + p[None, :]
    tl.store(out_ptrs, acc, mask=co_mask[:, None] & p_mask[None, :])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.bias = nn.Parameter(torch.zeros(out_channels, 1, 1))

    def forward(self, x):
        x = x.contiguous()
        w = self.conv.weight.contiguous()
        N, C_in, H, W = x.shape
        C_out = w.shape[0]
        out = torch.empty((N, C_out, H, W), device=x.device, dtype=x.dtype)
        BLOCK_CO, BLOCK_P = 16, 128
        grid = (N, triton.cdiv(C_out, BLOCK_CO), triton.cdiv(H * W, BLOCK_P))
        _conv3x3_kernel[grid](x, w, self.conv.bias, self.bias, out, C_in, C_out, H, W,
                              APPLY_RELU=True, ADD_BIAS2=True, BLOCK_CO=BLOCK_CO, BLOCK_P=BLOCK_P, num_warps=4)
        return out

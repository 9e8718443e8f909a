"""KernelBench `cuda` candidate for 13_conv2d: nn.Conv2d(Cin, Cout, 3, padding=1) with bias.

Direct convolution: one thread per output pixel computes 8 output channels at once (each input
value loaded once feeds 8 FMAs; the weights are block-uniform loads, served by the cache as
broadcasts). Zero padding by bounds checks; stride, padding and dilation are taken from the
module (groups must be 1).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

#define COB 8          // output channels per thread
#define NTHREADS 256   // output pixels per block

template <bool HAS_BIAS, bool RELU_BIAS>
__global__ void __launch_bounds__(NTHREADS)
conv2d_kernel(const float* __restrict__ x, const float* __restrict__ w,
              const float* __restrict__ cbias, const float* __restrict__ bias2,
              float* __restrict__ out, int Cin, int H, int W, int Cout, int KH, int KW,
              int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw) {
    const int p = blockIdx.x * NTHREADS + threadIdx.x;
    const int co0 = blockIdx.y * COB;
    const int n = blockIdx.z;
    if (p >= OH * OW) return;  // no shared memory or barriers below, so an early exit is safe
    const int oh = p / OW, ow = p % OW;
    const int ih0 = oh * sh - ph, iw0 = ow * sw - pw;

    // Channels past Cout (last channel block) read a valid weight row and are never written.
    int wbase[COB];
    #pragma unroll
    for (int c = 0; c < COB; ++c) wbase[c] = min(co0 + c, Cout - 1) * Cin * KH * KW;

    float acc[COB];
    #pragma unroll
    for (int c = 0; c < COB; ++c) acc[c] = 0.0f;

    for (int ci = 0; ci < Cin; ++ci) {
        const float* xc = x + ((int64_t)n * Cin + ci) * H * W;
        const int wci = ci * KH * KW;
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = ih0 + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = iw0 + kw * dw;
                if (iw < 0 || iw >= W) continue;
                const float v = xc[ih * W + iw];
                const int wk = wci + kh * KW + kw;
                #pragma unroll
                for (int c = 0; c < COB; ++c) acc[c] = fmaf(v, w[wbase[c] + wk], acc[c]);
            }
        }
    }

    #pragma unroll
    for (int c = 0; c < COB; ++c) {
        const int co = co0 + c;
        if (co >= Cout) break;
        float r = acc[c];
        if (HAS_BIAS) r += cbias[co];
        if (RELU_BIAS) {
            r = (r > 0.0f || r != r) ? r : 0.0f;  // ReLU (NaN propagates as in torch.relu)
            r += bias2[co];
        }
        out[(((int64_t)n * Cout + co) * OH + oh) * OW + ow] = r;
    }
}

torch::Tensor conv2d_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor cbias,
                           int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "x and weight must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "x (N, C, H, W) and weight (Cout, Cin, KH, KW)");
    TORCH_CHECK(x.size(1) == weight.size(1), "channel mismatch (groups must be 1)");
    TORCH_CHECK(sh > 0 && sw > 0 && dh > 0 && dw > 0 && ph >= 0 && pw >= 0, "bad stride/padding/dilation");
    x = x.contiguous();
    weight = weight.contiguous();
    const bool has_bias = cbias.numel() > 0;
    if (has_bias) {
        TORCH_CHECK(cbias.is_cuda() && cbias.scalar_type() == torch::kFloat32, "conv bias must be CUDA float32");
        TORCH_CHECK(cbias.numel() == weight.size(0), "conv bias must have out_channels elements");
        cbias = cbias.contiguous();
    }
    const int64_t N = x.size(0), Cin = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t Cout = weight.size(0), KH = weight.size(2), KW = weight.size(3);
    const int64_t OH = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
    const int64_t OW = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "output would be empty");
    TORCH_CHECK(N <= 65535, "batch too large for this kernel's grid");
    TORCH_CHECK(Cin * H * W < (1LL << 31) && Cout * Cin * KH * KW < (1LL << 31) && OH * OW < (1LL << 31),
                "sizes too large");
    auto out = torch::empty({N, Cout, OH, OW}, x.options());
    if (N == 0 || Cout == 0) return out;
    dim3 grid((unsigned)((OH * OW + NTHREADS - 1) / NTHREADS), (unsigned)((Cout + COB - 1) / COB), (unsigned)N);
    auto stream = at::cuda::getCurrentCUDAStream();
    const float* bptr = has_bias ? cbias.data_ptr<float>() : nullptr;
    if (has_bias) {
        conv2d_kernel<true, false><<<grid, NTHREADS, 0, stream>>>(
            x.data_ptr<float>(), weight.data_ptr<float>(), bptr, nullptr, out.data_ptr<float>(),
            (int)Cin, (int)H, (int)W, (int)Cout, (int)KH, (int)KW, (int)OH, (int)OW,
            (int)sh, (int)sw, (int)ph, (int)pw, (int)dh, (int)dw);
    } else {
        conv2d_kernel<false, false><<<grid, NTHREADS, 0, stream>>>(
            x.data_ptr<float>(), weight.data_ptr<float>(), bptr, nullptr, out.data_ptr<float>(),
            (int)Cin, (int)H, (int)W, (int)Cout, (int)KH, (int)KW, (int)OH, (int)OW,
            (int)sh, (int)sw, (int)ph, (int)pw, (int)dh, (int)dw);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "conv2d_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor conv2d_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor cbias, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw);"

conv2d_ext = load_inline(
    name="kz_ex_13_conv2d",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv2d_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        # Same parameters as the reference, so load_state_dict carries conv.weight / conv.bias.
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        assert self.conv.groups == 1 and self.conv.padding_mode == "zeros"

    def forward(self, x):
        c = self.conv
        cbias = c.bias if c.bias is not None else c.weight.new_empty(0)
        return conv2d_ext.conv2d_cuda(
            x, c.weight, cbias,
            c.stride[0], c.stride[1], c.padding[0], c.padding[1], c.dilation[0], c.dilation[1])

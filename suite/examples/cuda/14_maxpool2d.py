"""KernelBench `cuda` candidate for 14_maxpool2d: nn.MaxPool2d(2, 2) on (N, C, H, W).

One thread per output element; kernel size, stride, padding and dilation are read from an
nn.MaxPool2d held by the module (ceil_mode=False). Padding counts as -inf; NaN propagates as in
PyTorch.
"""
import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

__global__ void maxpool2d_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t total,
                                 int H, int W, int OH, int OW, int kh_, int kw_, int sh, int sw,
                                 int ph, int pw, int dh, int dw) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int ow = (int)(idx % OW);
        const int oh = (int)((idx / OW) % OH);
        const int64_t nc = idx / ((int64_t)OW * OH);
        const float* plane = x + nc * H * W;
        float m = -INFINITY;
        for (int kh = 0; kh < kh_; ++kh) {
            const int ih = oh * sh - ph + kh * dh;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < kw_; ++kw) {
                const int iw = ow * sw - pw + kw * dw;
                if (iw < 0 || iw >= W) continue;
                const float v = plane[ih * W + iw];
                if (v > m || v != v) m = v;
            }
        }
        out[idx] = m;
    }
}

torch::Tensor maxpool2d_cuda(torch::Tensor x, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 4, "x must be (N, C, H, W)");
    TORCH_CHECK(kh > 0 && kw > 0 && sh > 0 && sw > 0 && dh > 0 && dw > 0 && ph >= 0 && pw >= 0,
                "bad pooling parameters");
    x = x.contiguous();
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OH = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
    const int64_t OW = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "output would be empty");
    TORCH_CHECK(H * W < (1LL << 31), "plane too large");
    auto out = torch::empty({N, C, OH, OW}, x.options());
    const int64_t total = out.numel();
    if (total == 0) return out;
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((total + threads - 1) / threads, 1 << 20);
    maxpool2d_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), total, (int)H, (int)W, (int)OH, (int)OW,
        (int)kh, (int)kw, (int)sh, (int)sw, (int)ph, (int)pw, (int)dh, (int)dw);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "maxpool2d_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = ("torch::Tensor maxpool2d_cuda(torch::Tensor x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, "
              "int64_t ph, int64_t pw, int64_t dh, int64_t dw);")

maxpool2d_ext = load_inline(
    name="kz_ex_14_maxpool2d",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["maxpool2d_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2, 2)  # holds the pooling parameters only; no math is done by it
        assert not self.pool.ceil_mode and not self.pool.return_indices

    def forward(self, x):
        p = self.pool
        kh, kw = _pair(p.kernel_size)
        sh, sw = _pair(p.stride if p.stride is not None else p.kernel_size)
        ph, pw = _pair(p.padding)
        dh, dw = _pair(p.dilation)
        return maxpool2d_ext.maxpool2d_cuda(x, kh, kw, sh, sw, ph, pw, dh, dw)

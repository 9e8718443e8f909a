"""KernelBench `cuda` candidate for 15_avgpool2d: nn.AvgPool2d(3, stride=1, padding=1) on (N, C, H, W).

One thread per output element; kernel size, stride, padding, count_include_pad and
divisor_override are read from an nn.AvgPool2d held by the module (ceil_mode=False). The divisor
follows PyTorch: with count_include_pad the window clipped to the padded input, else the window
clipped to the input.
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

__global__ void avgpool2d_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t total,
                                 int H, int W, int OH, int OW, int kh_, int kw_, int sh, int sw,
                                 int ph, int pw, bool count_include_pad, int divisor_override) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int ow = (int)(idx % OW);
        const int oh = (int)((idx / OW) % OH);
        const int64_t nc = idx / ((int64_t)OW * OH);
        const float* plane = x + nc * H * W;
        int hstart = oh * sh - ph, wstart = ow * sw - pw;
        int hend = min(hstart + kh_, H + ph), wend = min(wstart + kw_, W + pw);
        const int pool_size = (hend - hstart) * (wend - wstart);
        hstart = max(hstart, 0);
        wstart = max(wstart, 0);
        hend = min(hend, H);
        wend = min(wend, W);
        float sum = 0.0f;
        for (int ih = hstart; ih < hend; ++ih)
            for (int iw = wstart; iw < wend; ++iw) sum += plane[ih * W + iw];
        int divisor;
        if (divisor_override > 0) divisor = divisor_override;
        else if (count_include_pad) divisor = pool_size;
        else divisor = (hend - hstart) * (wend - wstart);
        out[idx] = sum / (float)divisor;
    }
}

torch::Tensor avgpool2d_cuda(torch::Tensor x, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t ph, int64_t pw, bool count_include_pad, int64_t divisor_override) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 4, "x must be (N, C, H, W)");
    TORCH_CHECK(kh > 0 && kw > 0 && sh > 0 && sw > 0 && ph >= 0 && pw >= 0, "bad pooling parameters");
    TORCH_CHECK(2 * ph <= kh && 2 * pw <= kw, "padding must be at most half the kernel size");
    x = x.contiguous();
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OH = (H + 2 * ph - kh) / sh + 1;
    const int64_t OW = (W + 2 * pw - kw) / sw + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "output would be empty");
    TORCH_CHECK(H * W < (1LL << 31), "plane too large");
    auto out = torch::empty({N, C, OH, OW}, x.options());
    const int64_t total = out.numel();
    if (total == 0) return out;
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((total + threads - 1) / threads, 1 << 20);
    avgpool2d_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), total, (int)H, (int)W, (int)OH, (int)OW,
        (int)kh, (int)kw, (int)sh, (int)sw, (int)ph, (int)pw, count_include_pad, (int)divisor_override);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "avgpool2d_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = ("torch::Tensor avgpool2d_cuda(torch::Tensor x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, "
              "int64_t ph, int64_t pw, bool count_include_pad, int64_t divisor_override);")

avgpool2d_ext = load_inline(
    name="kz_ex_15_avgpool2d",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["avgpool2d_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(3, stride=1, padding=1)  # holds the parameters only; no math
        assert not self.pool.ceil_mode

    def forward(self, x):
        p = self.pool
        kh, kw = _pair(p.kernel_size)
        sh, sw = _pair(p.stride if p.stride is not None else p.kernel_size)
        ph, pw = _pair(p.padding)
        div = p.divisor_override if p.divisor_override else 0
        return avgpool2d_ext.avgpool2d_cuda(x, kh, kw, sh, sw, ph, pw, bool(p.count_include_pad), div)

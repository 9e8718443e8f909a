"""KernelBench `cuda` candidate for 19_scale_residual_gelu: F.gelu(x * scale + y), exact erf GELU.

One fused elementwise pass (float4-vectorized). x * scale is rounded on its own before the add,
as the reference's separate ops do.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

__device__ __forceinline__ float scale_residual_gelu_op(float x, float y, float s) {
    const float v = __fmul_rn(x, s) + y;
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

__global__ void scale_residual_gelu_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                           float* __restrict__ out, float s, int64_t n, bool vec) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t start = 0;
    if (vec) {
        const int64_t n4 = n >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* y4 = reinterpret_cast<const float4*>(y);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (int64_t i = tid; i < n4; i += stride) {
            const float4 vx = x4[i], vy = y4[i];
            float4 r;
            r.x = scale_residual_gelu_op(vx.x, vy.x, s);
            r.y = scale_residual_gelu_op(vx.y, vy.y, s);
            r.z = scale_residual_gelu_op(vx.z, vy.z, s);
            r.w = scale_residual_gelu_op(vx.w, vy.w, s);
            o4[i] = r;
        }
        start = n4 << 2;
    }
    for (int64_t i = start + tid; i < n; i += stride) {
        out[i] = scale_residual_gelu_op(x[i], y[i], s);
    }
}

static bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

torch::Tensor scale_residual_gelu_cuda(torch::Tensor x, torch::Tensor y, double scale) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "x and y must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.sizes() == y.sizes(), "x and y must have the same shape");
    x = x.contiguous();
    y = y.contiguous();
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return out;
    const bool vec = aligned16(x.data_ptr<float>()) && aligned16(y.data_ptr<float>()) &&
                     aligned16(out.data_ptr<float>());
    const int threads = 256;
    const int64_t work = vec ? (n + 3) / 4 : n;
    const int blocks = (int)std::min<int64_t>((work + threads - 1) / threads, 65535);
    scale_residual_gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), (float)scale, n, vec);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "scale_residual_gelu_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor scale_residual_gelu_cuda(torch::Tensor x, torch::Tensor y, double scale);"

scale_residual_gelu_ext = load_inline(
    name="kz_ex_19_scale_residual_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["scale_residual_gelu_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return scale_residual_gelu_ext.scale_residual_gelu_cuda(x, y, float(self.scale))

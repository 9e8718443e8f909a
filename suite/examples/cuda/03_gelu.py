"""KernelBench `cuda` candidate for 03_gelu: out = F.gelu(x), exact erf form (elementwise, float4-vectorized)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

__device__ __forceinline__ float gelu_op(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n, bool vec) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t start = 0;
    if (vec) {
        const int64_t n4 = n >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (int64_t i = tid; i < n4; i += stride) {
            float4 v = x4[i], r;
            r.x = gelu_op(v.x);
            r.y = gelu_op(v.y);
            r.z = gelu_op(v.z);
            r.w = gelu_op(v.w);
            o4[i] = r;
        }
        start = n4 << 2;
    }
    for (int64_t i = start + tid; i < n; i += stride) {
        out[i] = gelu_op(x[i]);
    }
}

static bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

torch::Tensor gelu_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return out;
    const bool vec = aligned16(x.data_ptr<float>()) && aligned16(out.data_ptr<float>());
    const int threads = 256;
    const int64_t work = vec ? (n + 3) / 4 : n;
    const int blocks = (int)std::min<int64_t>((work + threads - 1) / threads, 65535);
    gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n, vec);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "gelu_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor gelu_cuda(torch::Tensor x);"

gelu_ext = load_inline(
    name="kz_ex_03_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return gelu_ext.gelu_cuda(x)

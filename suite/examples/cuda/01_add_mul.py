"""KernelBench `cuda` candidate for 01_add_mul: out = a * b + c (elementwise, float4-vectorized)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

__global__ void add_mul_kernel(const float* __restrict__ a, const float* __restrict__ b,
                               const float* __restrict__ c, float* __restrict__ out,
                               int64_t n, bool vec) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t start = 0;
    if (vec) {
        const int64_t n4 = n >> 2;
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        const float4* c4 = reinterpret_cast<const float4*>(c);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (int64_t i = tid; i < n4; i += stride) {
            float4 va = a4[i], vb = b4[i], vc = c4[i], r;
            // __fmul_rn keeps the product rounded on its own, as PyTorch's two separate ops do.
            r.x = __fmul_rn(va.x, vb.x) + vc.x;
            r.y = __fmul_rn(va.y, vb.y) + vc.y;
            r.z = __fmul_rn(va.z, vb.z) + vc.z;
            r.w = __fmul_rn(va.w, vb.w) + vc.w;
            o4[i] = r;
        }
        start = n4 << 2;
    }
    for (int64_t i = start + tid; i < n; i += stride) {
        out[i] = __fmul_rn(a[i], b[i]) + c[i];
    }
}

static bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

torch::Tensor add_mul_cuda(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32 &&
                c.scalar_type() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == c.sizes(), "inputs must have the same shape");
    a = a.contiguous(); b = b.contiguous(); c = c.contiguous();
    auto out = torch::empty_like(a);
    const int64_t n = a.numel();
    if (n == 0) return out;
    const bool vec = aligned16(a.data_ptr<float>()) && aligned16(b.data_ptr<float>()) &&
                     aligned16(c.data_ptr<float>()) && aligned16(out.data_ptr<float>());
    const int threads = 256;
    const int64_t work = vec ? (n + 3) / 4 : n;
    const int blocks = (int)std::min<int64_t>((work + threads - 1) / threads, 65535);
    add_mul_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(), n, vec);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "add_mul_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor add_mul_cuda(torch::Tensor a, torch::Tensor b, torch::Tensor c);"

add_mul_ext = load_inline(
    name="kz_ex_01_add_mul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["add_mul_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, c):
        return add_mul_ext.add_mul_cuda(a, b, c)

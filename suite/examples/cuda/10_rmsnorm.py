"""KernelBench `cuda` candidate for 10_rmsnorm: x * rsqrt(mean(x^2, -1) + eps) * weight.

One block per row: sum of squares (warp-shuffle + shared-memory block reduction), then the
elementwise epilogue in the reference's order, (x * r) * weight.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// blockDim.x must be a multiple of 32 (<= 1024). Every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = (lane < nw) ? sh[lane] : 0.0f;
    if (wid == 0) v = warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                               float* __restrict__ out, int64_t D, float eps) {
    const int64_t off = (int64_t)blockIdx.x * D;
    const float* row = x + off;
    float* orow = out + off;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = row[i];
        s += v * v;
    }
    const float ms = block_sum(s) / (float)D;
    const float r = rsqrtf(ms + eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        orow[i] = (row[i] * r) * w[i];
    }
}

torch::Tensor rmsnorm_cuda(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "tensors must be on CUDA");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32,
                "tensors must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dim");
    x = x.contiguous();
    weight = weight.contiguous();
    const int64_t D = x.size(-1);
    TORCH_CHECK(weight.numel() == D, "weight must have the size of the last dim");
    auto out = torch::empty_like(x);
    if (x.numel() == 0) return out;
    const int64_t rows = x.numel() / D;
    TORCH_CHECK(rows <= 2147483647LL, "too many rows");
    const int threads = D >= 2048 ? 512 : 256;
    rmsnorm_kernel<<<(unsigned)rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), D, (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "rmsnorm_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor rmsnorm_cuda(torch::Tensor x, torch::Tensor weight, double eps);"

rmsnorm_ext = load_inline(
    name="kz_ex_10_rmsnorm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        # Same parameter name and shape as the reference (load_state_dict copies its values).
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rmsnorm_ext.rmsnorm_cuda(x, self.weight, float(self.eps))

"""KernelBench `cuda` candidate for 06_amax_lastdim: torch.amax(x, dim=-1).

One block per row; per-thread strided max, then a warp-shuffle + shared-memory block reduction.
NaN propagates as in torch.amax.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <vector>

__device__ __forceinline__ float max_nan(float a, float b) {
    return (a > b || a != a) ? a : b;
}

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// blockDim.x must be a multiple of 32 (<= 1024).
__device__ float block_max(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = (lane < nw) ? sh[lane] : -INFINITY;
    if (wid == 0) v = warp_max(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

__global__ void amax_lastdim_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t D) {
    const float* row = x + (int64_t)blockIdx.x * D;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) m = max_nan(m, row[i]);
    m = block_max(m);
    if (threadIdx.x == 0) out[blockIdx.x] = m;
}

torch::Tensor amax_lastdim_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dim");
    x = x.contiguous();
    const int64_t D = x.size(-1);
    TORCH_CHECK(D > 0, "amax over an empty dim");
    const int64_t rows = x.numel() / D;
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
    auto out = torch::empty(out_shape, x.options());
    if (rows == 0) return out;
    TORCH_CHECK(rows <= 2147483647LL, "too many rows");
    const int threads = 256;
    amax_lastdim_kernel<<<(unsigned)rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), D);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "amax_lastdim_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor amax_lastdim_cuda(torch::Tensor x);"

amax_ext = load_inline(
    name="kz_ex_06_amax_lastdim",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["amax_lastdim_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return amax_ext.amax_lastdim_cuda(x)

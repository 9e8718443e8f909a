"""KernelBench `cuda` candidate for 07_softmax: torch.softmax(x, dim=-1).

One block per row: max (block reduction), sum of exp(x - max) (block reduction), then the
elementwise epilogue. Rows of up to 12288 floats are cached in shared memory so global memory
is read once; longer rows are re-read from global memory (L2).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

#define MAX_CACHED 12288  // 48 KiB of floats: the default dynamic shared memory limit

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// blockDim.x must be a multiple of 32 (<= 1024). Every thread gets the result.
template <bool IS_MAX>
__device__ float block_reduce(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = (lane < nw) ? sh[lane] : (IS_MAX ? -INFINITY : 0.0f);
    if (wid == 0) v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

template <bool CACHE>
__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out, int D) {
    extern __shared__ float cache[];
    const float* row = x + (int64_t)blockIdx.x * D;
    float* orow = out + (int64_t)blockIdx.x * D;

    float m = -INFINITY;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = row[i];
        if (CACHE) cache[i] = v;  // each thread later reads back only the indices it wrote
        m = fmaxf(m, v);
    }
    m = block_reduce<true>(m);

    float s = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = CACHE ? cache[i] : row[i];
        s += expf(v - m);
    }
    s = block_reduce<false>(s);

    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = CACHE ? cache[i] : row[i];
        orow[i] = expf(v - m) / s;
    }
}

torch::Tensor softmax_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dim");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const int64_t D = x.size(-1);
    if (x.numel() == 0) return out;
    TORCH_CHECK(D <= 2147483647LL, "row too long");
    const int64_t rows = x.numel() / D;
    TORCH_CHECK(rows <= 2147483647LL, "too many rows");
    const int threads = D >= 4096 ? 512 : 256;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (D <= MAX_CACHED) {
        softmax_kernel<true><<<(unsigned)rows, threads, D * sizeof(float), stream>>>(
            x.data_ptr<float>(), out.data_ptr<float>(), (int)D);
    } else {
        softmax_kernel<false><<<(unsigned)rows, threads, 0, stream>>>(
            x.data_ptr<float>(), out.data_ptr<float>(), (int)D);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "softmax_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor softmax_cuda(torch::Tensor x);"

softmax_ext = load_inline(
    name="kz_ex_07_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return softmax_ext.softmax_cuda(x)

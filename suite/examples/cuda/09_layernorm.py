"""KernelBench `cuda` candidate for 09_layernorm: nn.LayerNorm(dim)(x), affine.

One block per row: mean (block reduction), variance as the mean of squared deviations (a second
block reduction, numerically safer than E[x^2] - mean^2), then (v - mean) * rstd * weight + bias.
Rows of up to 12288 floats are cached in shared memory so global memory is read once.
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

// ADD: the normalized value is x + residual. Without the cache (long rows) the sum is parked in
// `out`; each thread only ever reads back the indices it wrote itself.
template <bool CACHE, bool ADD>
__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ res,
                                 const float* __restrict__ w, const float* __restrict__ b,
                                 float* out, int D, float eps) {
    extern __shared__ float cache[];
    const int64_t off = (int64_t)blockIdx.x * D;
    const float* row = x + off;
    float* orow = out + off;

    float s = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = row[i];
        if (ADD) v += res[off + i];
        if (CACHE) cache[i] = v;
        else if (ADD) orow[i] = v;
        s += v;
    }
    const float mean = block_sum(s) / (float)D;

    float q = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = CACHE ? cache[i] : (ADD ? orow[i] : row[i]);
        const float d = v - mean;
        q += d * d;
    }
    const float var = block_sum(q) / (float)D;
    const float rstd = rsqrtf(var + eps);

    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        const float v = CACHE ? cache[i] : (ADD ? orow[i] : row[i]);
        orow[i] = (v - mean) * rstd * w[i] + b[i];
    }
}

template <bool ADD>
static void launch(const torch::Tensor& x, const float* res, const torch::Tensor& w,
                   const torch::Tensor& b, torch::Tensor& out, int64_t D, int64_t rows, double eps) {
    const int threads = D >= 2048 ? 512 : 256;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (D <= MAX_CACHED) {
        layernorm_kernel<true, ADD><<<(unsigned)rows, threads, D * sizeof(float), stream>>>(
            x.data_ptr<float>(), res, w.data_ptr<float>(), b.data_ptr<float>(),
            out.data_ptr<float>(), (int)D, (float)eps);
    } else {
        layernorm_kernel<false, ADD><<<(unsigned)rows, threads, 0, stream>>>(
            x.data_ptr<float>(), res, w.data_ptr<float>(), b.data_ptr<float>(),
            out.data_ptr<float>(), (int)D, (float)eps);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "layernorm_kernel launch failed: ", cudaGetErrorString(err));
}

torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "tensors must be on CUDA");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "tensors must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dim");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t D = x.size(-1);
    TORCH_CHECK(weight.numel() == D && bias.numel() == D, "weight/bias must have size of the last dim");
    TORCH_CHECK(D <= 2147483647LL, "row too long");
    auto out = torch::empty_like(x);
    if (x.numel() == 0) return out;
    const int64_t rows = x.numel() / D;
    TORCH_CHECK(rows <= 2147483647LL, "too many rows");
    launch<false>(x, nullptr, weight, bias, out, D, rows, eps);
    return out;
}
"""

cpp_source = "torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"

layernorm_ext = load_inline(
    name="kz_ex_09_layernorm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layernorm_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        # Same submodule name as the reference, so load_state_dict carries norm.weight / norm.bias.
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return layernorm_ext.layernorm_cuda(x, self.norm.weight, self.norm.bias, float(self.norm.eps))

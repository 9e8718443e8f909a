"""KernelBench `cuda` candidate for 20_mse_loss: torch.mean((pred - target) ** 2), a 0-d fp32 tensor.

Deterministic two-stage reduction: a grid-stride kernel writes one partial sum per block
(warp-shuffle + shared-memory block reduction), then a single block sums the partials and
divides by the element count into the 0-d output.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

#define NTHREADS 256
#define MAX_BLOCKS 1024

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// blockDim.x must be a multiple of 32 (<= 1024). Thread 0 gets the result.
__device__ float block_sum(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = (lane < nw) ? sh[lane] : 0.0f;
    if (wid == 0) v = warp_sum(v);
    return v;
}

__global__ void mse_partial_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ partial, int64_t n, bool vec) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    int64_t start = 0;
    if (vec) {
        const int64_t n4 = n >> 2;
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        for (int64_t i = tid; i < n4; i += stride) {
            const float4 va = a4[i], vb = b4[i];
            const float dx = va.x - vb.x, dy = va.y - vb.y, dz = va.z - vb.z, dw = va.w - vb.w;
            acc += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
        start = n4 << 2;
    }
    for (int64_t i = start + tid; i < n; i += stride) {
        const float d = a[i] - b[i];
        acc += d * d;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void mse_final_kernel(const float* __restrict__ partial, int nparts, float* __restrict__ out,
                                 int64_t n) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[0] = acc / (float)n;
}

static bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

torch::Tensor mse_loss_cuda(torch::Tensor pred, torch::Tensor target) {
    TORCH_CHECK(pred.is_cuda() && target.is_cuda(), "pred and target must be CUDA tensors");
    TORCH_CHECK(pred.scalar_type() == torch::kFloat32 && target.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(pred.sizes() == target.sizes(), "pred and target must have the same shape");
    pred = pred.contiguous();
    target = target.contiguous();
    const int64_t n = pred.numel();
    auto out = torch::empty({}, pred.options());  // 0-d, like torch.mean's result
    const int64_t work = (n + 3) / 4;
    const int nblocks = (int)std::max<int64_t>(1, std::min<int64_t>((work + NTHREADS - 1) / NTHREADS, MAX_BLOCKS));
    auto partial = torch::empty({nblocks}, pred.options());  // scratch for the per-block sums
    const bool vec = aligned16(pred.data_ptr<float>()) && aligned16(target.data_ptr<float>());
    auto stream = at::cuda::getCurrentCUDAStream();
    mse_partial_kernel<<<nblocks, NTHREADS, 0, stream>>>(
        pred.data_ptr<float>(), target.data_ptr<float>(), partial.data_ptr<float>(), n, vec);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "mse_partial_kernel launch failed: ", cudaGetErrorString(err));
    // n == 0 gives 0/0 = NaN, as torch.mean of an empty tensor does.
    mse_final_kernel<<<1, 1024, 0, stream>>>(partial.data_ptr<float>(), nblocks, out.data_ptr<float>(), n);
    err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "mse_final_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor mse_loss_cuda(torch::Tensor pred, torch::Tensor target);"

mse_loss_ext = load_inline(
    name="kz_ex_20_mse_loss",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mse_loss_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return mse_loss_ext.mse_loss_cuda(pred, target)

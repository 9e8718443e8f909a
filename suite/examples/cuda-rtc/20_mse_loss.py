"""cuda-rtc candidate for 20_mse_loss: mean((pred - target)^2) as a 0-d fp32 tensor.

Two launches, no atomics: each block of the first writes its partial sum of squares, the second
(one block) adds the partial sums in double and divides by the element count.
"""
import torch
import torch.nn as nn

import kz_rtc

SOURCE = r"""
#define NEG_INF __int_as_float(0xff800000)  // -inf (NVRTC has no <math.h> INFINITY)

// Block-wide reductions: warp shuffles, then one value per warp through shared memory.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Every thread of the block gets the result; safe to call several times in a row.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float partial[33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // the previous call's readers of partial[32] are done
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? partial[lane] : (is_max ? NEG_INF : 0.f);
        v = is_max ? warp_max(v) : warp_sum(v);
        if (lane == 0) partial[32] = v;
    }
    __syncthreads();
    return partial[32];
}
__device__ __forceinline__ float sq(float a, float b) {
    float d = a - b;
    return d * d;
}

extern "C" __global__ void sq_diff_partial_kernel(const float* __restrict__ p, const float* __restrict__ t,
                                                  float* __restrict__ partial, long long n, long long n4) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.f;
    for (long long i = tid; i < n4; i += stride) {  // n4 float4 groups (0 when unaligned)
        float4 a = reinterpret_cast<const float4*>(p)[i];
        float4 b = reinterpret_cast<const float4*>(t)[i];
        s += (sq(a.x, b.x) + sq(a.y, b.y)) + (sq(a.z, b.z) + sq(a.w, b.w));
    }
    for (long long i = 4 * n4 + tid; i < n; i += stride) s += sq(p[i], t[i]);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" __global__ void mean_of_partials_kernel(const float* __restrict__ partial, int count,
                                                   float* __restrict__ out, long long n) {
    __shared__ double acc[1024];
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += (double)partial[i];
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {  // blockDim.x is a power of two
        if (threadIdx.x < half) acc[threadIdx.x] += acc[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = n > 0 ? (float)(acc[0] / (double)n) : __int_as_float(0x7fc00000);
}
"""

THREADS = 256
MAX_BLOCKS = 1024  # enough to fill the GPU several times; each block strides over the rest
FINAL_THREADS = 1024


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = kz_rtc.compile(SOURCE, name="20_mse_loss")

    def forward(self, pred, target):
        pred, target = pred.contiguous(), target.contiguous()
        out = torch.empty((), device=pred.device, dtype=torch.float32)
        n = pred.numel()
        n4 = n // 4 if pred.data_ptr() % 16 == 0 and target.data_ptr() % 16 == 0 else 0
        blocks = max(1, min(MAX_BLOCKS, (max(n4, n - 4 * n4) + THREADS - 1) // THREADS))
        partial = torch.empty(blocks, device=pred.device, dtype=torch.float32)
        self.kernels.sq_diff_partial_kernel(pred, target, partial, n, n4, grid=(blocks,), block=(THREADS,))
        self.kernels.mean_of_partials_kernel(partial, blocks, out, n, grid=(1,), block=(FINAL_THREADS,))
        return out

"""cuda-rtc candidate for 10_rmsnorm: x * rsqrt(mean(x^2, -1) + eps) * weight, one block per row."""
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
extern "C" __global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                          float* __restrict__ y, int cols, float eps, int vec) {
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    const int start = vec ? cols : 0;  // vec: cols % 4 == 0 and 16-byte aligned rows
    float s = 0.f;
    if (vec) {
        for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(row)[i];
            s += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
        }
    }
    for (int i = start + threadIdx.x; i < cols; i += blockDim.x) s += row[i] * row[i];
    const float r = 1.f / sqrtf(block_reduce(s, false) / cols + eps);
    if (vec) {  // the row is read again, now from L1/L2
        for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(row)[i];
            float4 g = reinterpret_cast<const float4*>(w)[i];
            reinterpret_cast<float4*>(out)[i] = make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
        }
    }
    for (int i = start + threadIdx.x; i < cols; i += blockDim.x) out[i] = row[i] * r * w[i];
}
"""

THREADS = 256


class ModelNew(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.kernels = kz_rtc.compile(SOURCE, name="10_rmsnorm")

    def forward(self, x):
        x = x.contiguous()
        w = self.weight.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        if rows == 0:
            return y
        vec = int(cols % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in (x, w, y)))
        self.kernels.rmsnorm_kernel(x, w, y, cols, float(self.eps), vec, grid=(rows,), block=(THREADS,))
        return y

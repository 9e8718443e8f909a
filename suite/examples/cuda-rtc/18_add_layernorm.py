"""cuda-rtc candidate for 18_add_layernorm: layer_norm(x + residual) fused, one block per row.

The row is staged in dynamic shared memory (cols * 4 bytes), so the mean and the variance are
two exact passes over on-chip data and global memory is read once and written once.
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
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

extern "C" __global__ void add_layernorm_kernel(const float* __restrict__ x, const float* __restrict__ r,
                                                const float* __restrict__ w, const float* __restrict__ b,
                                                float* __restrict__ y, int cols, float eps, int vec) {
    extern __shared__ __align__(16) float row[];
    const size_t base = (size_t)blockIdx.x * cols;
    const int start = vec ? cols : 0;  // vec: cols % 4 == 0, all pointers 16-byte aligned
    float s = 0.f;
    if (vec) {
        for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            float4 v = add4(reinterpret_cast<const float4*>(x + base)[i], reinterpret_cast<const float4*>(r + base)[i]);
            reinterpret_cast<float4*>(row)[i] = v;
            s += (v.x + v.y) + (v.z + v.w);
        }
    }
    for (int i = start + threadIdx.x; i < cols; i += blockDim.x) {
        float v = x[base + i] + r[base + i];
        row[i] = v;
        s += v;
    }
    const float mean = block_reduce(s, false) / cols;
    float q = 0.f;
    if (vec) {
        for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(row)[i];
            const float d0 = v.x - mean, d1 = v.y - mean, d2 = v.z - mean, d3 = v.w - mean;
            q += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
        }
    }
    for (int i = start + threadIdx.x; i < cols; i += blockDim.x) {
        const float d = row[i] - mean;
        q += d * d;
    }
    const float var = block_reduce(q, false) / cols;  // biased, as LayerNorm
    const float rstd = 1.f / sqrtf(var + eps);
    if (vec) {
        for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            const float4 v = reinterpret_cast<const float4*>(row)[i];
            const float4 g = reinterpret_cast<const float4*>(w)[i];
            const float4 h = reinterpret_cast<const float4*>(b)[i];
            reinterpret_cast<float4*>(y + base)[i] = make_float4((v.x - mean) * rstd * g.x + h.x,
                                                                 (v.y - mean) * rstd * g.y + h.y,
                                                                 (v.z - mean) * rstd * g.z + h.z,
                                                                 (v.w - mean) * rstd * g.w + h.w);
        }
    }
    for (int i = start + threadIdx.x; i < cols; i += blockDim.x) y[base + i] = (row[i] - mean) * rstd * w[i] + b[i];
}
"""

THREADS = 256
MAX_SHARED = 200 * 1024  # one row in shared memory (an H100/H200 block may use up to 227 KiB)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.kernels = kz_rtc.compile(SOURCE, name="18_add_layernorm")

    def forward(self, x, residual):
        x, residual = x.contiguous(), residual.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        if rows == 0:
            return y
        if cols * 4 > MAX_SHARED:
            raise ValueError(f"rows of {cols} floats do not fit in shared memory")
        w, b = self.norm.weight.contiguous(), self.norm.bias.contiguous()
        vec = int(cols % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in (x, residual, w, b, y)))
        self.kernels.add_layernorm_kernel(x, residual, w, b, y, cols, float(self.norm.eps), vec,
                                          grid=(rows,), block=(THREADS,), shared_mem=cols * 4)
        return y

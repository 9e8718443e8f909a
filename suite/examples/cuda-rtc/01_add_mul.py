"""cuda-rtc candidate for 01_add_mul: a * b + c in one fp32 pass (float4 loads when aligned)."""
import torch
import torch.nn as nn

import kz_rtc

SOURCE = r"""
// __fmul_rn is never contracted into an FMA: the product is rounded first, as torch does.
extern "C" __global__ void add_mul_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                          const float* __restrict__ c, float* __restrict__ out,
                                          long long n, long long n4) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (long long i = tid; i < n4; i += stride) {  // n4 float4 groups (0 when unaligned)
        float4 x = reinterpret_cast<const float4*>(a)[i];
        float4 y = reinterpret_cast<const float4*>(b)[i];
        float4 z = reinterpret_cast<const float4*>(c)[i];
        float4 r;
        r.x = __fmul_rn(x.x, y.x) + z.x;
        r.y = __fmul_rn(x.y, y.y) + z.y;
        r.z = __fmul_rn(x.z, y.z) + z.z;
        r.w = __fmul_rn(x.w, y.w) + z.w;
        reinterpret_cast<float4*>(out)[i] = r;
    }
    for (long long i = 4 * n4 + tid; i < n; i += stride) out[i] = __fmul_rn(a[i], b[i]) + c[i];
}
"""

THREADS = 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = kz_rtc.compile(SOURCE, name="01_add_mul")

    def forward(self, a, b, c):
        a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
        out = torch.empty_like(a)
        n = a.numel()
        if n == 0:
            return out
        aligned = all(t.data_ptr() % 16 == 0 for t in (a, b, c, out))
        n4 = n // 4 if aligned else 0
        blocks = (max(n4, n - 4 * n4) + THREADS - 1) // THREADS
        self.kernels.add_mul_kernel(a, b, c, out, n, n4, grid=(blocks,), block=(THREADS,))
        return out

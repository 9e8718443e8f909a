"""cuda-rtc candidate for 05_sum_dim1: torch.sum(x, dim=1) on (B, D1, D2) -> (B, D2).

A block owns 32 adjacent columns of one batch: threadIdx.x walks 4 columns each (one float4 when
D2 % 4 == 0 and the data is 16-byte aligned), threadIdx.y splits D1 into ROWS interleaved
slices, and the ROWS partial sums are added through shared memory.
"""
import torch
import torch.nn as nn

import kz_rtc

SOURCE = r"""
#define COLS 32   // columns per block: 8 threads x 4 columns
#define ROWS 32   // threads along D1

extern "C" __global__ void sum_dim1_kernel(const float* __restrict__ x, float* __restrict__ out,
                                           int d1, int d2, int vec) {
    __shared__ float4 part[ROWS][COLS / 4 + 1];
    const int c0 = blockIdx.x * COLS + 4 * threadIdx.x;
    const float* base = x + (size_t)blockIdx.y * d1 * d2;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (vec) {  // d2 % 4 == 0, aligned: c0 < d2 implies c0 + 3 < d2
        if (c0 < d2) {
#pragma unroll 4
            for (int r = threadIdx.y; r < d1; r += ROWS) {
                const float4 v = *reinterpret_cast<const float4*>(base + (size_t)r * d2 + c0);
                acc.x += v.x;
                acc.y += v.y;
                acc.z += v.z;
                acc.w += v.w;
            }
        }
    } else {
        for (int r = threadIdx.y; r < d1; r += ROWS) {
            const float* row = base + (size_t)r * d2;
            if (c0 < d2) acc.x += row[c0];
            if (c0 + 1 < d2) acc.y += row[c0 + 1];
            if (c0 + 2 < d2) acc.z += row[c0 + 2];
            if (c0 + 3 < d2) acc.w += row[c0 + 3];
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    for (int half = ROWS / 2; half > 0; half >>= 1) {  // tree over the ROWS partial sums
        if (threadIdx.y < half) {
            float4 a = part[threadIdx.y][threadIdx.x];
            const float4 b = part[threadIdx.y + half][threadIdx.x];
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
            part[threadIdx.y][threadIdx.x] = a;
        }
        __syncthreads();
    }
    if (threadIdx.y == 0) {
        const float4 s = part[0][threadIdx.x];
        float* o = out + (size_t)blockIdx.y * d2;
        if (c0 < d2) o[c0] = s.x;
        if (c0 + 1 < d2) o[c0 + 1] = s.y;
        if (c0 + 2 < d2) o[c0 + 2] = s.z;
        if (c0 + 3 < d2) o[c0 + 3] = s.w;
    }
}
"""

COLS, ROWS = 32, 32


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = kz_rtc.compile(SOURCE, name="05_sum_dim1")

    def forward(self, x):
        x = x.contiguous()
        b, d1, d2 = x.shape
        out = torch.empty((b, d2), device=x.device, dtype=x.dtype)
        if out.numel() == 0:
            return out
        vec = int(d2 % 4 == 0 and x.data_ptr() % 16 == 0)
        self.kernels.sum_dim1_kernel(x, out, d1, d2, vec, grid=((d2 + COLS - 1) // COLS, b), block=(COLS // 4, ROWS))
        return out

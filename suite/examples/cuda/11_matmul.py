"""KernelBench `cuda` candidate for 11_matmul: torch.matmul(A, B), A (M, K), B (K, N).

Register-blocked fp32 SGEMM: 128x128 output tile per 256-thread block, K staged through shared
memory 8 at a time, each thread accumulating an 8x8 sub-tile in registers (rows ty + 16*i,
columns tx + 16*j, so shared-memory reads are conflict-free). Loads are bounds-checked (zero
fill), so any M, N, K works (K = 0 gives zeros, plus the bias where there is one).
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

#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
#define NTHREADS 256

// C (M, N) = A (M, K) @ op(B), op(B) = B (K, N) or, with TRANS_B, B is stored (N, K) as in
// nn.Linear's weight. Optional bias over N and ReLU in the epilogue.
template <bool TRANS_B, bool HAS_BIAS, bool RELU>
__global__ void __launch_bounds__(NTHREADS)
sgemm_kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
             float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[BK][BM + 4];  // A tile stored k-major; +4 padding avoids bank conflicts
    __shared__ float Bs[BK][BN + 4];
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        #pragma unroll
        for (int l = 0; l < (BM * BK) / NTHREADS; ++l) {
            const int e = tid + NTHREADS * l;
            const int r = e >> 3, c = e & 7;  // r: row in tile (0..127), c: k in tile (0..7)
            const int gm = m0 + r, gk = k0 + c;
            As[c][r] = (gm < M && gk < K) ? A[(int64_t)gm * K + gk] : 0.0f;
        }
        #pragma unroll
        for (int l = 0; l < (BN * BK) / NTHREADS; ++l) {
            const int e = tid + NTHREADS * l;
            if (TRANS_B) {
                const int r = e >> 3, c = e & 7;  // r: n in tile, c: k in tile
                const int gn = n0 + r, gk = k0 + c;
                Bs[c][r] = (gn < N && gk < K) ? B[(int64_t)gn * K + gk] : 0.0f;
            } else {
                const int r = e >> 7, c = e & 127;  // r: k in tile, c: n in tile
                const int gk = k0 + r, gn = n0 + c;
                Bs[r][c] = (gk < K && gn < N) ? B[(int64_t)gk * N + gn] : 0.0f;
            }
        }
        __syncthreads();

        // Accumulate straight into the running total in K order, as cuBLAS does for fp32:
        // a different summation order drifts ~1e-3 from it at K = 4096 (outside the 1e-4 tolerance).
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty + 16 * i];
            #pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx + 16 * j];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int gm = m0 + ty + 16 * i;
        if (gm >= M) continue;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int gn = n0 + tx + 16 * j;
            if (gn >= N) continue;
            float v = acc[i][j];
            if (HAS_BIAS) v += bias[gn];
            if (RELU) v = fmaxf(v, 0.0f);
            C[(int64_t)gm * N + gn] = v;
        }
    }
}

torch::Tensor matmul_cuda(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "A and B must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "A and B must be float32");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2, "A and B must be 2-D");
    TORCH_CHECK(A.size(1) == B.size(0), "inner dimensions differ");
    A = A.contiguous();
    B = B.contiguous();
    const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
    TORCH_CHECK(M < (1LL << 31) && N < (1LL << 31) && K < (1LL << 31), "sizes too large");
    auto out = torch::empty({M, N}, A.options());
    if (M == 0 || N == 0) return out;
    dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM));
    TORCH_CHECK(grid.y <= 65535, "M too large for this kernel's grid");
    sgemm_kernel<false, false, false><<<grid, NTHREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        A.data_ptr<float>(), B.data_ptr<float>(), nullptr, out.data_ptr<float>(), (int)M, (int)N, (int)K);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "sgemm_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor matmul_cuda(torch::Tensor A, torch::Tensor B);"

matmul_ext = load_inline(
    name="kz_ex_11_matmul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["matmul_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return matmul_ext.matmul_cuda(A, B)

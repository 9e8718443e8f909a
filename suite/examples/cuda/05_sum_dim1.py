"""KernelBench `cuda` candidate for 05_sum_dim1: torch.sum(x, dim=1) on (B, D1, D2) -> (B, D2).

Each block owns 32 adjacent output columns of one batch; its 8 thread rows split D1 (coalesced
32-float reads along D2) and the 8 partial sums per column are combined in shared memory.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

#define TX 32
#define TY 8

__global__ void sum_dim1_kernel(const float* __restrict__ x, float* __restrict__ out,
                                int64_t D1, int64_t D2) {
    __shared__ float partial[TY][TX + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t b = blockIdx.y;
    const int64_t col = (int64_t)blockIdx.x * TX + tx;
    float acc = 0.0f;
    if (col < D2) {
        const float* base = x + b * D1 * D2 + col;
        for (int64_t r = ty; r < D1; r += TY) {
            acc += base[r * D2];
        }
    }
    partial[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && col < D2) {
        float s = 0.0f;
        #pragma unroll
        for (int i = 0; i < TY; ++i) s += partial[i][tx];
        out[b * D2 + col] = s;
    }
}

torch::Tensor sum_dim1_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 3, "x must be 3-D (B, D1, D2)");
    x = x.contiguous();
    const int64_t B = x.size(0), D1 = x.size(1), D2 = x.size(2);
    auto out = torch::empty({B, D2}, x.options());
    if (B == 0 || D2 == 0) return out;
    TORCH_CHECK(B <= 65535, "batch too large for this kernel's grid");
    dim3 threads(TX, TY);
    dim3 blocks((unsigned)((D2 + TX - 1) / TX), (unsigned)B);
    sum_dim1_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), D1, D2);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "sum_dim1_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor sum_dim1_cuda(torch::Tensor x);"

sum_dim1_ext = load_inline(
    name="kz_ex_05_sum_dim1",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sum_dim1_cuda"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return sum_dim1_ext.sum_dim1_cuda(x)

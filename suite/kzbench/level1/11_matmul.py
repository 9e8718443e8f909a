"""Matrix multiply torch.matmul(A, B) with A (M, K) and B (K, N)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


m = 2048
k = 4096
n = 2048
cpu_sizes = {"m": 32, "k": 64, "n": 48}


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, n)]


def get_init_inputs():
    return []

"""RMSNorm over the last dim: x * rsqrt(mean(x^2, -1) + 1e-6) * weight."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        with torch.no_grad():
            self.weight.normal_(1.0, 0.1)

    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.weight


batch_size = 4096
dim = 4096
cpu_sizes = {"batch_size": 8, "dim": 256}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]

"""Scale, residual add, exact (erf) GELU: F.gelu(x * scale + y) with scale a float init input."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        return F.gelu(x * self.scale + y)


batch_size = 4096
dim = 8192
scale = 0.75
cpu_sizes = {"batch_size": 8, "dim": 256}


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scale]

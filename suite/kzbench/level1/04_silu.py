"""Elementwise SiLU: F.silu(x) = x * sigmoid(x)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.silu(x)


batch_size = 4096
dim = 8192
cpu_sizes = {"batch_size": 8, "dim": 256}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

"""Max over the last dim: torch.amax(x, dim=-1), (batch_size, dim) -> (batch_size,)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.amax(x, dim=-1)


batch_size = 4096
dim = 8192
cpu_sizes = {"batch_size": 8, "dim": 300}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

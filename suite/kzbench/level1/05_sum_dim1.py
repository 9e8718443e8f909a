"""Sum reduction over dim 1 of a (batch_size, dim1, dim2) tensor, giving (batch_size, dim2)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=1)


batch_size = 32
dim1 = 1024
dim2 = 1024
cpu_sizes = {"batch_size": 2, "dim1": 64, "dim2": 32}


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return []

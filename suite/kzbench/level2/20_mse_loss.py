"""Mean squared error over all elements: torch.mean((pred - target) ** 2), a 0-d fp32 output."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return torch.mean((pred - target) ** 2)


batch_size = 4096
dim = 8192
cpu_sizes = {"batch_size": 8, "dim": 256}


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

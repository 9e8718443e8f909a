"""Elementwise a * b + c on three (batch_size, dim) tensors."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, c):
        return a * b + c


batch_size = 4096
dim = 4096
cpu_sizes = {"batch_size": 8, "dim": 256}


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []

"""Residual add then affine LayerNorm over the last dim: layer_norm(x + residual)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.norm.bias.normal_(0.0, 0.1)

    def forward(self, x, residual):
        return self.norm(x + residual)


batch_size = 4096
dim = 4096
cpu_sizes = {"batch_size": 8, "dim": 256}


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
